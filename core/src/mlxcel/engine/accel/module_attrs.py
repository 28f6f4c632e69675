"""A model's submodules as plain instance attributes: a cheaper forward to build.

``nn.Module`` keeps its children (submodules, arrays, lists of them) in itself, as a dict,
so every ``self.q_proj`` or ``self.self_attn`` in an mlx-lm forward misses the instance
attributes and is then found by ``Module.__getattr__``, a Python call: a Llama-shaped
decode step makes about a dozen of them per layer. Where the host builds every step's
graph while the device waits for it (CUDA), that Python is part of each step.
``bind(model)`` copies each module's submodules (and lists or tuples of them, such as
``layers``) into its instance attributes, where the lookup finds them without that call;
the forward builds the same graph. On by default on CUDA only
(``EnginePolicy.bind_modules``).

The rule: the model's structure is final when ``bind`` runs. Replacing a submodule later
through ``Module.__setattr__`` or ``update_modules`` writes the dict, not the copy, so the
engine binds last at setup (after ``fused_proj.fuse``, which rebinds what it replaces) and
never swaps a submodule afterwards. Arrays stay in the dict (a model may reassign one while
it runs), and so does a child whose name is also an attribute of the module's class (a
method or property), which normal lookup already prefers.
"""

from __future__ import annotations

from typing import Any

import mlx.nn as nn


def bind(model: Any) -> int:
    """Copy the submodules of every module of ``model`` (an ``nn.Module``, or an engine
    wrapper holding one as ``.model``) into its instance attributes; returns how many."""
    if not isinstance(model, nn.Module):
        model = getattr(model, "model", None)
        if not isinstance(model, nn.Module):
            return 0
    bound = 0
    for _, module in model.named_modules():
        own = vars(module)
        for key, value in module.items():
            if key in own or hasattr(type(module), key) or not _structural(value):
                continue
            object.__setattr__(module, key, value)
            bound += 1
    return bound


def _structural(value: Any) -> bool:
    """A submodule, or a non-empty list or tuple of them."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, nn.Module) for v in value)
    return isinstance(value, nn.Module)
