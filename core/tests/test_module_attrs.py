"""Bound module attributes (``mlxcel.engine.accel.module_attrs``): the same forward, built
without ``Module.__getattr__`` for submodules."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlxcel.engine.accel import fused_proj, module_attrs
from twin_models import SHAPE as TINY
from twin_models import twin_models

SHAPE = {**TINY, "model_type": "llama"}


def pair():
    return twin_models(llama, SHAPE)


def lookups(model, x, monkeypatch) -> int:
    """``Module.__getattr__`` calls that find a submodule during one forward."""
    found = []
    original = nn.Module.__getattr__

    def counting(self, key):
        value = original(self, key)
        if isinstance(value, (nn.Module, list)):
            found.append(key)
        return value

    monkeypatch.setattr(nn.Module, "__getattr__", counting)
    model(x)
    monkeypatch.setattr(nn.Module, "__getattr__", original)
    return len(found)


def test_bound_model_gives_the_same_logits_without_submodule_lookups(monkeypatch):
    plain, bound = pair()
    fused_proj.fuse(bound)
    assert module_attrs.bind(bound) > 0
    x = mx.array([[5, 9, 17, 33, 2, 8]])
    assert lookups(plain, x, monkeypatch) > 10 * SHAPE["num_hidden_layers"]
    assert lookups(bound, x, monkeypatch) == 0
    assert mx.allclose(plain(x), bound(x), atol=1e-5).item()
    layer = bound.model.layers[0]
    assert vars(layer)["self_attn"] is layer["self_attn"]  # the same object, not a copy
    assert "weight" not in vars(layer.input_layernorm)  # arrays stay in the dict


def test_names_the_class_defines_are_left_to_the_class():
    m = nn.Module()
    m["update"] = nn.Linear(2, 2)  # a child named like a Module method
    m["proj"] = nn.Linear(2, 2)
    assert module_attrs.bind(m) == 1
    assert callable(m.update) and not isinstance(m.update, nn.Linear)
    assert vars(m)["proj"] is m["proj"]


def test_engine_with_bound_modules_gives_the_same_tokens(path):
    from apphelpers import PROMPTS
    from mlxcel.testing.engine import run_until_done, submit, worker_for

    outputs = []
    for bind in (False, True):
        worker = worker_for(path, bind_modules=bind, fuse_projections=bind)
        layer = worker.checkpoint.model.model.model.layers[0]
        assert ("self_attn" in vars(layer)) is bind
        sinks = [submit(worker, p, max_tokens=8) for p in PROMPTS]
        run_until_done(worker, sinks)
        outputs.append([s.tokens for s in sinks])
    assert outputs[0] == outputs[1]
