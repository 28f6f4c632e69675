"""Attention on MLX's CPU device with a cheaper softmax.

MLX's CPU ``exp`` (and every other transcendental) costs ~20-26 ns per element on the CI
machine, scalar, where a multiply costs ~0.5 ns: the softmax of a 4 x 118-token prefill
group (223K scores per layer) took 6 ms, almost all of a tiny model's prefill. Here
``exp`` is composed from element-wise ops MLX runs vectorised: ``2^y`` split into
``2^floor(y)`` (built in the float's exponent bits) times a degree-7 polynomial of the
fraction, relative error < 1e-6 (float32 eps is 1.2e-7). The softmax takes about half the
time (``bench/results/serving.md``, session 4). The engine uses it for prefill chunks
(``mlxcel.engine.accel.attention``).

Scores are masked with the most negative float32 rather than -inf, like MLX's own
fallback: a query row with no visible key (a left-padded prefill position) gets uniform
weights instead of NaNs that would reach the cache.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

LOG2E = 1.4426950408889634
FLOOR = -60.0  # 2^-60 against a row maximum of 1: nothing at float32 precision
# 2^f = e^(f ln 2) for f in [0, 1): Taylor coefficients (ln 2)^k / k!
_COEFFS = (1.0, 0.6931471805599453, 0.2402265069591007, 0.05550410866482158,
           0.009618129107628477, 0.0013333558146428443, 0.00015403530393381606,
           1.525273380405984e-05)


def exp2(y: mx.array) -> mx.array:
    """``2 ** y`` for float32 ``y`` in [FLOOR, 0]."""
    n = mx.floor(y)
    f = y - n
    p = mx.array(_COEFFS[-1], mx.float32)
    for c in reversed(_COEFFS[:-1]):
        p = p * f + c
    scale = mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)  # 2^n, n in [-60, 0]
    return p * scale


def softmax(scores: mx.array) -> mx.array:
    """Softmax over the last axis of float32 ``scores`` (finite or -inf entries)."""
    top = scores.max(axis=-1, keepdims=True)
    weights = exp2(mx.maximum((scores - top) * LOG2E, FLOOR))
    return weights / weights.sum(axis=-1, keepdims=True)


def _mask_5d(mask: mx.array, hq: int, hkv: int) -> mx.array | None:
    """``mask`` as broadcastable to scores [B, Hkv, G, N, L], or None if its shape is not
    one mlx-lm builds ([N, L], [B, 1, N, L], [B, Hq, N, L])."""
    if mask.ndim <= 2:
        return mask
    if mask.ndim == 4 and mask.shape[1] == 1:
        return mask[:, :, None]
    if mask.ndim == 4 and mask.shape[1] == hq:
        return mask.reshape(mask.shape[0], hkv, hq // hkv, *mask.shape[2:])
    return None


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
              mask: mx.array | str | None) -> mx.array | None:
    """``queries`` [B, Hq, N, D] over ``keys``/``values`` [B, Hkv, L, D] (the queries being
    the last N positions), float32, with mlx-lm's ``mask`` (None, ``"causal"``, a boolean
    or an additive array); None when the shapes are not ones handled here."""
    b, hq, n, d = queries.shape
    hkv, length = keys.shape[1], keys.shape[2]
    if (queries.dtype != mx.float32 or hq % hkv or values.shape[1] != hkv
            or length < n):
        return None
    group = hq // hkv
    if isinstance(mask, str):
        if mask != "causal":
            return None
        mask = create_causal_mask(n, offset=length - n)
    if mask is not None:
        mask = _mask_5d(mask, hq, hkv)
        if mask is None:
            return None
    q = (queries * scale).reshape(b, hkv, group * n, d)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(b, hkv, group, n, length)
    if mask is not None:
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(mx.float32).min)
        else:
            scores = scores + mask
    weights = softmax(scores).reshape(b, hkv, group * n, length)
    return (weights @ values).reshape(b, hq, n, values.shape[-1])
