"""A prefill chunk's logits at one column per row: where each row's prompt ends.

A row's first token is sampled from the logits at its prompt's last position, which the
prefill's last chunk computes (``batch``). No other column's logits are wanted, yet a
model's forward projects every column onto the vocabulary: the widest matmul of the
forward (columns x vocabulary) and its largest result. ``Heads`` shadows the model's output
projection for one forward (each ``lm_head`` submodule, and each ``embed_tokens``'s
``as_linear`` for tied embeddings) with one that projects only the chosen column of
each row; what the model does after it (soft-capping, scaling) is per position and
sees those columns alone.

The rule: the shadow is used only where one forward through it gives the logits of the
model's own forward at the chosen column (``Heads.for_model``, at setup); otherwise, and
wherever a forward's output still has every column, the columns are taken from the full
logits (``pick``): the same tokens, at the cost above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import structlog

log = structlog.get_logger("mlxcel.engine")
_MISSING = object()


def _network(model: Any) -> Any:
    """The ``nn.Module`` behind ``model`` (itself, or an engine wrapper's ``.model``)."""
    return model if isinstance(model, nn.Module) else getattr(model, "model", None)


def _targets(model: Any) -> list[tuple[Any, str]]:
    """(module, attribute) of every output projection a forward of ``model`` may call."""
    root = _network(model)
    if not isinstance(root, nn.Module):
        return []
    found = []
    for name, module in root.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embed_tokens" and callable(getattr(module, "as_linear", None)):
            found.append((module, "as_linear"))
        head = module.get("lm_head") if isinstance(module, dict) else None
        if isinstance(head, nn.Module):
            found.append((module, "lm_head"))
    return found


def pick(logits: mx.array, cols: mx.array | None) -> mx.array:
    """[B, V] logits of each row's chosen column from a forward's [B, L, V] output (one
    column already where the shadow chose it): ``cols`` [B], or None for the last."""
    if logits.shape[1] == 1:
        return logits[:, 0]
    if cols is None:
        return logits[:, -1]
    return logits[mx.arange(logits.shape[0]), cols]


class Heads:
    """A model's output projections, shadowed for one forward at a time (see the module
    docstring); ``Heads(None)`` shadows nothing."""

    def __init__(self, model: Any) -> None:
        self.targets = _targets(model) if model is not None else []

    @contextlib.contextmanager
    def only(self, cols: mx.array | None) -> Iterator[None]:
        """Within the block, each shadowed projection takes only column ``cols[b]`` of row
        ``b`` (the last column where None) of a [B, L, D] input."""
        saved = []
        try:
            for owner, attr in self.targets:
                saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
                object.__setattr__(owner, attr, _narrowed(getattr(owner, attr), cols))
            yield
        finally:
            for owner, attr, before in reversed(saved):
                if before is _MISSING:
                    object.__delattr__(owner, attr)
                else:
                    object.__setattr__(owner, attr, before)

    def logits(self, forward: Callable[[], mx.array], cols: mx.array | None) -> mx.array:
        """[B, V]: ``forward()``'s logits at each row's column ``cols`` (None: the last)."""
        if not self.targets:
            return pick(forward(), cols)
        with self.only(cols):
            return pick(forward(), cols)

    @classmethod
    def for_model(cls, model: Any) -> Heads:
        """The shadow where it agrees with ``model``'s own forward on a short prompt (two
        rows, each's column checked), else ``Heads(None)``; logged either way."""
        heads = cls(model)
        if not heads.targets:
            log.info("prefill_last_logits", narrowed=False, reason="no output projection found")
            return cls(None)
        try:
            tokens = mx.array([[3, 4, 5, 6], [7, 8, 9, 10]], dtype=mx.uint32)
            cols = mx.array([3, 1], dtype=mx.int32)
            want = pick(model(tokens, model.make_cache()), cols).astype(mx.float32)
            got = heads.logits(lambda: model(tokens, model.make_cache()), cols)
            got = got.astype(mx.float32)
            scale = mx.max(mx.abs(want)).item() or 1.0
            agrees = got.shape == want.shape and \
                mx.max(mx.abs(want - got)).item() <= 3e-2 * scale
        except Exception as exc:  # a layout the shadow gets wrong: full logits
            log.warning("prefill_last_logits_check_failed",
                        error=f"{type(exc).__name__}: {exc}"[:300])
            agrees = False
        log.info("prefill_last_logits", narrowed=agrees, projections=len(heads.targets))
        return heads if agrees else cls(None)


def _narrowed(project: Callable[[mx.array], mx.array], cols: mx.array | None
              ) -> Callable[[mx.array], mx.array]:
    def narrowed(x: mx.array) -> mx.array:
        if x.ndim != 3 or x.shape[1] == 1:
            return project(x)
        if cols is None:
            return project(x[:, -1:])
        return project(x[mx.arange(x.shape[0]), cols][:, None])

    return narrowed
