"""Per-row rollback of a verify step on the mixed path's caches (mlx-lm's kinds).

A verify step feeds every row ``W`` tokens in one forward (``mlxcel.engine.verify``); row r
then keeps its first ``W - drops[r]``. The shared path's ``BatchCache`` forgets the rest
itself (``BatchCache.rollback``). On the mixed path the caches are mlx-lm's, so
``begin_verify`` (called just before the verify forward) gives each layer cache of the
batch a ``rollback(drops)`` of the same signature for that step, and verify's one loop
works on both paths. What each kind does:

* **plain KV** (``KVCache``, one row; ``BatchKVCache``): what every row drops moves the
  write index back; a row that drops more is rolled right by the difference, into left
  padding of its own (as ``BatchCache.rollback``). Keys of the kept positions are the ones
  the verify forward computed: under a causal mask they depend only on the tokens before
  them, which are the row's context.
* **rotating** (sliding window; ``RotatingKVCache``, ``BatchRotatingKVCache``): a
  multi-token update first puts the ring in temporal order and keeps the window's last
  ``max_size - 1`` tokens before the new ones, so every rejected position is at the end of
  the buffer and the window the next token needs is still there: the buffer is cut at the
  row's last kept token (rows that keep less rolled right as above). mlx-lm's own ``trim``
  would not do: the next one-token update cuts the buffer's front to ``max_size`` slots,
  which would keep the rejected tail and drop the window. A batch cache that rotated is put
  in temporal order before the forward, so the mask the model builds matches the layout
  the update gives.
* **recurrent / conv state** (``ArraysCache``): one state after the last token, which
  cannot be cut back. Its entries are saved before the forward (references: the models
  assign new arrays, never write into them). After it, every layer goes back to its state
  before the step and the kept tokens are fed again in one forward, right-padded where
  rows keep different counts (``prepare(lengths=..., right_padding=...)`` and
  ``finalize()``, as a prefill group does), so every layer holds exactly the row's
  context. Its logits are never read, so the LM head is never computed; the price is the
  rest of a forward of ``max(kept)`` tokens per verify step, which the batch governor
  weighs like the rest of a verify step's cost.

Rows that may not be padded together (``mixed_batch.pads_state``), or whose recurrent
layers lose state under right padding (``replays_padded``, checked on the model), cannot
be replayed together, and a family's own batch caches are unknown here:
``rollback_reason`` says so, and speculation stays off for those models.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    RotatingKVCache,
    dynamic_roll,
)


def leaves(cache: Any) -> list[Any]:
    """The non-container caches of one layer's cache (``CacheList``s opened)."""
    if isinstance(cache, CacheList):
        return [leaf for c in cache.caches for leaf in leaves(c)]
    return [cache]


def rollback_reason(model: Any, family: Any, pads_state: bool) -> str | None:
    """None when every cache ``model`` makes can roll back per row on the mixed path;
    else why not, for the ``speculation_off`` log line. ``pads_state``: whether its rows
    may be padded together (``mixed_batch.pads_state``), which a ragged replay needs."""
    if getattr(family, "batch_cache", None):
        return "the family's own batch caches cannot roll back per row"
    for leaf in (leaf for c in model.make_cache() for leaf in leaves(c)):
        kind = type(leaf)
        if kind is KVCache:
            continue
        if kind is RotatingKVCache:
            if leaf.keep:
                return "rotating caches that keep their first tokens cannot roll back"
            continue
        if kind is ArraysCache:
            if not pads_state:
                return ("recurrent layers that do not mask padding cannot replay "
                        "ragged acceptance")
            continue
        return f"{kind.__name__} layers cannot roll back per row"
    if any(type(leaf) is ArraysCache for c in model.make_cache() for leaf in leaves(c)) \
            and not replays_padded(model):
        return ("recurrent layers that lose their state under right padding cannot "
                "replay ragged acceptance")
    return None


def replays_padded(model: Any) -> bool:
    """Whether a right-padded replay leaves a row the recurrent state an unpadded one
    does: two rows, each prefilled alone and merged, fed 4 and 2 tokens in one padded
    forward, against the short row fed its 2 tokens alone. Masking padding is not
    enough: a state update may also drop what a row fed before its padding (mlx-lm's
    Nemotron-H SSM, which reads the mask but not the lengths, ends such a row at zero).
    The rule is checked on the model itself, once, as the engine's other equivalences
    are (``lean_decode``)."""

    def alone(tokens: list[int]) -> list[Any]:
        caches = model.make_cache()
        model(mx.array([tokens], dtype=mx.uint32), caches)
        return caches

    rows = [alone(list(range(1, 9))), alone(list(range(9, 13)))]
    batch = [type(layer[0]).merge(list(layer)) for layer in zip(*rows, strict=True)]
    for c in batch:
        c.prepare(lengths=[4, 2], right_padding=[0, 2])
    model(mx.array([[13, 14, 15, 16], [17, 18, 0, 0]], dtype=mx.uint32), batch)
    for c in batch:
        c.finalize()
    ref = alone([*range(9, 13), 17, 18])
    for mine, theirs in zip(batch, ref, strict=True):
        for a, b in zip(leaves(mine), leaves(theirs), strict=True):
            if type(b) is not ArraysCache:
                continue
            for x, y in zip(a.cache, b.cache, strict=True):
                if x is None or y is None:
                    continue
                scale = mx.abs(y).max().item()
                if mx.abs(x[1:2].astype(mx.float32) - y).max().item() > 0.05 * scale + 1e-3:
                    return False
    return True


def begin_verify(model: Any, caches: list[Any], inputs: mx.array) -> None:
    """Before a verify forward of ``inputs`` [B, W] on ``caches``: give each layer cache
    a ``rollback(drops)`` for this step (see the module docstring). The shared path's
    ``BatchCache`` has its own: nothing to do there."""
    if not caches or callable(getattr(type(caches[0]), "rollback", None)):
        return
    _Verify(model, caches, inputs)


class _Verify:
    """One verify step's rollback over a batch's layer caches: each layer's ``rollback``
    is bound to ``done``; the last call finishes the step and detaches them."""

    def __init__(self, model: Any, caches: list[Any], inputs: mx.array) -> None:
        self.model, self.caches, self.inputs = model, caches, inputs
        self.width = inputs.shape[1]
        self.leaves = list({id(leaf): leaf for c in caches for leaf in leaves(c)}.values())
        self.replay = any(type(leaf) is ArraysCache for leaf in self.leaves)
        self.saved: dict[int, tuple[list[Any], Any, Any]] = {}
        for leaf in self.leaves:
            if type(leaf) is BatchRotatingKVCache and leaf.rotated:
                leaf._temporal_order()  # what the update does first, before the mask
            elif type(leaf) is ArraysCache:
                self.saved[id(leaf)] = (list(leaf.cache), _copy(leaf.left_padding),
                                        _copy(leaf.lengths))
        self.calls = 0
        self.drops: list[int] | None = None
        for i, cache in enumerate(caches):
            cache.rollback = partial(self.done, i)

    def done(self, index: int, drops: list[int]) -> None:
        """Layer ``index``'s rollback; the last layer's also replays (recurrent state)."""
        if self.drops is None:
            self.drops = list(drops)
        elif list(drops) != self.drops:
            raise ValueError("every layer of a verify step drops the same tokens")
        if self.replay:  # every layer back to its state before the step
            for leaf in leaves(self.caches[index]):
                self._restore(leaf)
        else:
            for leaf in leaves(self.caches[index]):
                _drop(leaf, self.drops)
        self.calls += 1
        if self.calls < len(self.caches):
            return
        for cache in self.caches:
            del cache.rollback
        if self.replay:
            self._replay()

    def _restore(self, leaf: Any) -> None:
        saved = self.saved.get(id(leaf))
        if saved is None:
            _drop(leaf, [self.width] * _rows(leaf, len(self.drops)))
        else:
            leaf.cache, leaf.left_padding, leaf.lengths = list(saved[0]), saved[1], saved[2]

    def _replay(self) -> None:
        """Feed every row its kept tokens (the first ``W - drop`` of its inputs) again."""
        kept = [self.width - d for d in self.drops]
        cols = max(kept)
        if cols < 2 and any(type(leaf) is BatchRotatingKVCache for leaf in self.leaves):
            cols = 2  # one token would take the in-place update, whose layout differs
        pads = [cols - n for n in kept]
        tokens = self.inputs[:, :cols] if cols <= self.width else mx.pad(
            self.inputs, [(0, 0), (0, cols - self.width)])
        if any(pads):
            for c in self.caches:
                c.prepare(lengths=kept, right_padding=pads)
        self.model(tokens, self.caches)
        if any(pads):
            for c in self.caches:
                c.finalize()


def _copy(a: Any) -> Any:
    """A small bookkeeping array copied: ``ArraysCache.advance`` changes them in place."""
    return None if a is None else mx.array(a)


def _rows(leaf: Any, default: int) -> int:
    offset = getattr(leaf, "offset", None)
    return offset.shape[0] if isinstance(offset, mx.array) else default


def _drop(leaf: Any, drops: list[int]) -> None:
    """Forget the last ``drops[r]`` tokens of each row r of one leaf cache."""
    kind = type(leaf)
    if kind is KVCache:
        leaf.trim(drops[0])
    elif kind is RotatingKVCache:
        _drop_rotating(leaf, drops[0])
    elif kind is BatchKVCache:
        _drop_batch_kv(leaf, drops)
    elif kind is BatchRotatingKVCache:
        _drop_batch_rotating(leaf, drops)
    else:
        raise TypeError(f"{kind.__name__} cannot roll back per row")


def _drop_rotating(leaf: RotatingKVCache, n: int) -> None:
    """One row's sliding window: cut the buffer (temporal order after the multi-token
    update) at its last kept token."""
    if not n:
        return
    if leaf.keys is None or leaf._idx != leaf.keys.shape[2]:
        raise RuntimeError("a rotating cache rolls back only after a multi-token update")
    leaf._idx -= n
    leaf.offset -= n
    leaf.keys = leaf.keys[..., :leaf._idx, :]
    leaf.values = leaf.values[..., :leaf._idx, :]


def _drop_batch_kv(leaf: BatchKVCache, drops: list[int]) -> None:
    common = min(drops)
    if common:
        leaf.trim(common)
    extra = [d - common for d in drops]
    if not any(extra) or leaf.keys is None:
        return
    shift = mx.array(extra)
    # rolled over the whole buffer: what wraps to the front lies in the new padding
    leaf.keys = dynamic_roll(leaf.keys, shift[:, None], axis=2)
    leaf.values = dynamic_roll(leaf.values, shift[:, None], axis=2)
    leaf.left_padding = leaf.left_padding + shift
    leaf.offset = leaf.offset - shift


def _drop_batch_rotating(leaf: BatchRotatingKVCache, drops: list[int]) -> None:
    if leaf.keys is None or leaf.rotated or leaf._idx != leaf.keys.shape[2]:
        raise RuntimeError("a rotating cache rolls back only after a multi-token update")
    common = min(drops)
    if common:
        leaf._idx -= common
        leaf._offset -= common
        leaf.offset = leaf.offset - common
        leaf.keys = leaf.keys[..., :leaf._idx, :]
        leaf.values = leaf.values[..., :leaf._idx, :]
    extra = [d - common for d in drops]
    if not any(extra):
        return
    shift = mx.array(extra)
    leaf.keys = dynamic_roll(leaf.keys, shift[:, None], axis=2)
    leaf.values = dynamic_roll(leaf.values, shift[:, None], axis=2)
    # a row whose front was cut off (negative padding) starts after its rolled-in tail
    leaf.left_padding = mx.maximum(leaf.left_padding, 0) + shift
    leaf.offset = leaf.offset - shift
