"""Vectorized per-row sampling over a [B, V] logits block (no Python loop over the vocab).

Chain, applied to log-probabilities: top-k -> top-p -> min-p -> temperature -> sample
(Gumbel-max). Rows with temperature 0 take the argmax. A seeded row draws its noise from
its own key chain, so its output does not depend on the other rows in the batch.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcel.types import SamplingParams

NEG_INF = float("-inf")


class RowRandom:
    """A seeded row's PRNG key chain (None: use MLX's global generator)."""

    def __init__(self, seed: int | None) -> None:
        self.key = mx.random.key(seed % (1 << 64)) if seed is not None else None

    def next(self) -> Any:
        self.key, sub = mx.random.split(self.key)
        return sub


class BatchSampler:
    """Samples one token per row; built once per batch composition."""

    def __init__(self, params: list[SamplingParams], randoms: list[RowRandom],
                 vocab_size: int) -> None:
        self.randoms = randoms
        self.vocab = vocab_size
        temps = [p.temperature for p in params]
        self.all_greedy = all(t <= 0 for t in temps)
        self.any_greedy = any(t <= 0 for t in temps)
        self.greedy = mx.array([t <= 0 for t in temps])[:, None]
        self.inv_temp = mx.array([1.0 / t if t > 0 else 1.0 for t in temps])[:, None]
        ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        self.use_top_k = any(k < vocab_size for k in ks)
        self.k_index = mx.array([k - 1 for k in ks])[:, None]
        self.use_top_p = any(0 < p.top_p < 1 for p in params)
        self.top_p = mx.array([p.top_p if 0 < p.top_p < 1 else 1.0 for p in params])[:, None]
        self.use_min_p = any(p.min_p > 0 for p in params)
        self.min_p = mx.array([p.min_p for p in params])[:, None]
        self.any_seeded = any(r.key is not None for r in randoms)

    def __call__(self, logits: mx.array) -> mx.array:
        """``logits`` [B, V] -> token ids [B] (lazy)."""
        if self.all_greedy:
            return mx.argmax(logits, axis=-1)
        logprobs = logits.astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        keep = self._keep_mask(logprobs)
        if keep is not None:
            logprobs = mx.where(keep, logprobs, NEG_INF)
        sampled = mx.argmax(logprobs * self.inv_temp + self._gumbel(logprobs.shape), axis=-1)
        if self.any_greedy:
            sampled = mx.where(self.greedy[:, 0], mx.argmax(logits, axis=-1), sampled)
        return sampled

    def _keep_mask(self, logprobs: mx.array) -> mx.array | None:
        keep = None
        if self.use_top_k or self.use_top_p:
            ordered = -mx.sort(-logprobs, axis=-1)  # descending
            if self.use_top_k:
                kth = mx.take_along_axis(ordered, self.k_index, axis=-1)
                keep = logprobs >= kth
            if self.use_top_p:
                probs = mx.exp(ordered)
                before = mx.cumsum(probs, axis=-1) - probs  # mass strictly above each token
                n_keep = mx.maximum(mx.sum(before < self.top_p, axis=-1, keepdims=True), 1)
                pth = mx.take_along_axis(ordered, n_keep - 1, axis=-1)
                keep_p = logprobs >= pth
                keep = keep_p if keep is None else keep & keep_p
        if self.use_min_p:
            top = mx.max(logprobs, axis=-1, keepdims=True)
            floor = mx.where(self.min_p > 0, top + mx.log(mx.maximum(self.min_p, 1e-30)),
                             NEG_INF)
            keep_m = logprobs >= floor
            keep = keep_m if keep is None else keep & keep_m
        return keep

    def _gumbel(self, shape: tuple[int, ...]) -> mx.array:
        noise = mx.random.gumbel(shape=shape)
        if not self.any_seeded:
            return noise
        rows = [mx.random.gumbel(shape=shape[1:], key=r.next()) if r.key is not None
                else noise[i] for i, r in enumerate(self.randoms)]
        return mx.stack(rows)
