"""Per-sequence sampling on MLX arrays (the batched, full-parameter sampler comes later)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxcel.types import SamplingParams


class Sampler:
    """Temperature / top-k / top-p / min-p; a seeded request gets its own PRNG key chain."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self._key = mx.random.key(params.seed) if params.seed is not None else None

    def __call__(self, logits: mx.array) -> mx.array:
        """``logits`` [1, V] -> token id array [1] (lazy)."""
        p = self.params
        if p.temperature <= 0:
            return mx.argmax(logits, axis=-1)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < p.top_k < self.vocab_size:
            logprobs = apply_top_k(logprobs, p.top_k)
        if 0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0:
            logprobs = apply_min_p(logprobs, p.min_p)
        scaled = logprobs * (1.0 / p.temperature)
        if self._key is None:
            return mx.random.categorical(scaled)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(scaled, key=sub)
