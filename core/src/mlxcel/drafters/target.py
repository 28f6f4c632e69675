"""One row's keys and values out of the target's layer caches (``DraftRow.cache``), for
drafters that attend to the target's own cache (Gemma 4's assistant).

The engine decodes on mlx-lm's caches (``KVCache``, ``RotatingKVCache`` for one row;
``BatchKVCache``, ``BatchRotatingKVCache`` for a batch, left-padded per row) or on its
own ``BatchCache`` (per-row pads; keys rotated at positions the batch shares, where the
engine shares them). ``row_kv`` gives what a one-row ``KVCache`` would hold: the row's
positions in temporal order from 0, padding dropped, as [1, heads, n, dim] arrays. Plain
layers give views of the batch's buffers (no copy); a rotating layer gives its window put
in order, and shared-position keys are rotated back (``BatchCache.row``): copies.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def _plain(keys: Any, values: Any, start: int, end: int) -> tuple[mx.array, mx.array]:
    return keys[..., start:end, :], values[..., start:end, :]


def row_kv(cache: Any, index: int) -> tuple[mx.array, mx.array] | None:
    """Row ``index``'s (keys, values) in ``cache`` (one layer's), oldest first; None for
    a layer that holds none (empty, or a kind without keys: recurrent state)."""
    from mlx_lm.models.cache import (
        BatchKVCache,
        BatchRotatingKVCache,
        KVCache,
        RotatingKVCache,
    )

    from mlxcel.engine.cache.kvcache import BatchCache

    if getattr(cache, "keys", None) is None:
        return None
    kind = type(cache)
    if kind is KVCache:
        return _plain(cache.keys, cache.values, 0, cache.offset)
    if kind is BatchKVCache:
        pad = int(cache.left_padding[index].item())
        return _plain(cache.keys[index:index + 1], cache.values[index:index + 1],
                      max(0, pad), cache._idx)
    if kind is BatchCache:  # shared positions: rotated back to the row's own (a copy)
        return cache.row(index, cache._idx - cache.pads[index])
    if kind is BatchRotatingKVCache:
        cache = cache.extract(index)  # the row's window, in order
        kind = type(cache)
    if kind is RotatingKVCache:
        keys, values = cache.keys, cache.values
        if cache.offset < keys.shape[2]:
            keys, values = keys[..., :cache.offset, :], values[..., :cache.offset, :]
        keys, values = cache._temporal_order(keys), cache._temporal_order(values)
        n = min(cache.offset, cache.max_size, keys.shape[2])
        return keys[..., keys.shape[2] - n:, :], values[..., values.shape[2] - n:, :]
    return None
