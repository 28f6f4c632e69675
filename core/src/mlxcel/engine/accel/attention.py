"""Decode attention for a padded batch, without MLX's masked fallback.

One decode step of a batch whose rows are left-padded needs a mask. MLX's fused SDPA
kernels take no array mask on CUDA, so ``mx.fast.scaled_dot_product_attention`` falls back
to a composed path that, for grouped-query attention, broadcasts keys and values across the
query heads of a group; that costs about a third of a Llama-3-8B step at batch 64 on an
H200 (bench/results/cache_probe_gpu.md). Here the query heads of a group become the rows
of one small matmul against their shared KV head instead, so keys and values are read once
and never copied.

On CUDA the engine prefers one custom kernel per layer that reads each row from its first
valid slot (``mlxcel.engine.accel.varlen_attention``), where that kernel compiles and passes its
self-check; the grouped path above is the fallback. The kernel also takes short prefill
chunks (causal, left-padded rows), where MLX's CUDA SDPA would build a cuDNN plan for
every new shape (~50 ms each on an H200).

On MLX's CPU device the engine takes ``mlxcel.engine.accel.cpu_attention`` for prefill chunks:
the same attention with a softmax that avoids MLX's scalar CPU ``exp``, 1.4-1.7x faster
per layer for a chunk of a few hundred tokens.

``install(model)`` wraps the ``scaled_dot_product_attention`` that the model's decoder
layers call, in the module that defines them (an mlx-lm model's, or a VLM language
model's in mlx-vlm, found through ``language_model``). On CUDA the wrapper takes the
kernel for steps on the engine's own ``BatchCache`` with an array mask and for decode
steps on mlx-lm's ``BatchKVCache`` and unwrapped ``BatchRotatingKVCache`` (a KV-shared
layer, which gets no cache, takes its source layer's rows: it gets the same mask), the
grouped path for other decode steps with a boolean [B, 1, 1, L] mask (a wrapped sliding
window, a head size the kernel lacks), and calls the original otherwise.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from mlxcel.backend import mlx_device, on_cuda
from mlxcel.engine.accel import cpu_attention, varlen_attention
from mlxcel.engine.accel.layers import first_layer
from mlxcel.engine.cache.kvcache import BatchCache


def grouped_decode_attention(queries: mx.array, keys: mx.array, values: mx.array,
                             scale: float, mask: mx.array) -> mx.array:
    """``queries`` [B, Hq, 1, D], ``keys``/``values`` [B, Hkv, L, D], boolean ``mask``
    broadcastable to [B, 1, 1, L] -> [B, Hq, 1, D]."""
    b, hq, _, d = queries.shape
    hkv = keys.shape[1]
    q = queries.reshape(b, hkv, hq // hkv, d) * scale
    scores = q @ keys.swapaxes(-1, -2)  # [B, Hkv, group, L]
    scores = mx.where(mask, scores, mx.array(float("-inf"), scores.dtype))
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(b, hq, 1, values.shape[-1])


def _starts(cache: Any, n: int) -> mx.array | None:
    """Per row, the first slot that holds a token, where every slot after it does (what
    the varlen kernel needs), or None: the engine's ``BatchCache`` always; for a decode
    step, mlx-lm's ``BatchKVCache`` and a ``BatchRotatingKVCache`` that has not wrapped yet
    (its window then still holds every token, from its left padding on)."""
    if isinstance(cache, BatchCache):
        return cache.pad_array()
    if n != 1 or cache is None:
        return None
    kind = type(cache)
    if kind is BatchKVCache or (kind is BatchRotatingKVCache and not cache.rotated
                                and cache._offset <= cache.max_size):
        return mx.maximum(cache.left_padding, 0).astype(mx.int32)
    return None


def _wrap(original: Any, mode: str) -> Any:
    # recent (mask, starts) by the mask's id, the mask held so that its id stays its own:
    # a KV-shared layer gets no cache but its source layer's mask object
    seen: dict[int, tuple[mx.array, mx.array]] = {}

    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if mode == "composed":
            # prefill chunks only: a decode step's few scores cost less than the composed
            # softmax's ~15 extra ops (tiny model, one row: 3.75 vs 3.23 ms per step)
            out = None if sinks is not None or queries.shape[2] == 1 else \
                cpu_attention.attention(queries, keys, values, scale, mask)
            if out is not None:
                return out
        elif sinks is None and isinstance(mask, mx.array) and mask.dtype == mx.bool_:
            if mode == "varlen" and varlen_attention.supports(queries, keys, values):
                starts = _starts(cache, queries.shape[2])
                if starts is None and cache is None:
                    known = seen.get(id(mask))
                    starts = known[1] if known is not None and known[0] is mask else None
                elif starts is not None and id(mask) not in seen:
                    if len(seen) >= 4:
                        del seen[next(iter(seen))]
                    seen[id(mask)] = (mask, starts)
                if starts is not None:
                    return varlen_attention.varlen_decode_attention(queries, keys, values,
                                                                    scale, starts)
            if queries.shape[2] == 1 and mask.ndim == 4 and mask.shape[1] == 1:
                # any batch cache's decode mask ([B, 1, 1, L]): mlx-lm's, for every
                # other cache mix, as well as the engine's BatchCache
                return grouped_decode_attention(queries, keys, values, scale, mask)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask,
                        sinks=sinks)

    scaled_dot_product_attention.mlxcel_original = original
    scaled_dot_product_attention.mlxcel_mode = mode
    return scaled_dot_product_attention


def mode(choice: str | None = None) -> str:
    """``choice`` (``--decode-attention``): ``varlen`` / ``grouped`` / ``composed`` /
    ``fused``; ``auto`` (default) = ``varlen`` on CUDA where the kernel passed its
    self-check, else ``grouped`` on CUDA (MLX has no fused masked kernel there),
    ``composed`` on MLX's CPU device and MLX's own kernel (``fused``) on Metal. ``varlen``
    where the kernel is unavailable means ``grouped``."""
    choice = (choice or "auto").strip().lower()
    if choice == "composed" or (choice == "auto" and mlx_device() == "cpu"):
        return "composed"
    if choice == "fused" or (choice not in ("varlen", "grouped") and not on_cuda()):
        return "fused"
    if choice in ("varlen", "auto") and varlen_attention.available():
        return "varlen"
    return "grouped"


def _module(model: Any) -> Any:
    """The module whose ``scaled_dot_product_attention`` the decoder layers call: the one
    that defines their class (an mlx-lm model's, a VLM language model's: found through
    ``language_model``), else the one that defines ``model``'s class."""
    layer = first_layer(model)
    module = sys.modules.get(type(layer).__module__) if layer is not None else None
    if module is not None and hasattr(module, "scaled_dot_product_attention"):
        return module
    return sys.modules.get(type(getattr(model, "model", model)).__module__)


def install(model: Any, enable: bool | None = None, choice: str | None = None) -> str | None:
    """Route ``model``'s masked attention on the engine's caches (decode steps; prefill
    chunks too for ``varlen``) through the ``mode(choice)`` path (see the module
    docstring); returns that path's name, or None when MLX's own kernel stays
    (``enable=False``, or ``fused``). ``enable=True`` forces a path (``grouped`` unless
    ``choice`` names one) on any device."""
    if enable is False:
        return None
    picked = mode(choice) if enable is None else (choice or "grouped")
    if picked == "varlen" and not varlen_attention.available():
        picked = "grouped"
    if picked == "fused":
        return None
    module = _module(model)
    current = getattr(module, "scaled_dot_product_attention", None)
    if current is None:
        return None
    if getattr(current, "mlxcel_mode", picked) != picked:
        current = current.mlxcel_original
        module.scaled_dot_product_attention = current
    if not hasattr(current, "mlxcel_original"):
        module.scaled_dot_product_attention = _wrap(current, picked)
    return picked


def uninstall(model: Any) -> None:
    module = _module(model)
    current = getattr(module, "scaled_dot_product_attention", None)
    if hasattr(current, "mlxcel_original"):
        module.scaled_dot_product_attention = current.mlxcel_original
