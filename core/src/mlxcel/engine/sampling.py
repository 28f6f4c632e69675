"""Vectorized per-row sampling over a [B, V] logits block (no Python loop over the vocab).

Chain (docs/explanation/sampling.md): penalties (repetition, frequency, presence, DRY;
engine/penalties.py) -> top-k -> top-p -> min-p -> XTC -> p-less -> temperature -> sample
(Gumbel-max). Rows with temperature 0 take the argmax of the penalised logits. A seeded
row draws its randomness from its own key chain, so its output does not depend on the
other rows in the batch.
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


def _col(values: list[float | int | bool]) -> mx.array:
    return mx.array(values)[:, None]


class BatchSampler:
    """Samples one token per row; built once per batch composition."""

    def __init__(self, params: list[SamplingParams], randoms: list[RowRandom],
                 vocab_size: int) -> None:
        self.randoms = randoms
        self.vocab = vocab_size
        temps = [p.temperature for p in params]
        self.all_greedy = all(t <= 0 for t in temps)
        self.any_greedy = any(t <= 0 for t in temps)
        self.greedy = mx.array([t <= 0 for t in temps])
        self.inv_temp = _col([1.0 / t if t > 0 else 1.0 for t in temps])
        ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        self.use_top_k = any(k < vocab_size for k in ks)
        self.k_index = _col([k - 1 for k in ks])
        self.use_top_p = any(0 < p.top_p < 1 for p in params)
        self.top_p = _col([p.top_p if 0 < p.top_p < 1 else 1.0 for p in params])
        self.use_min_p = any(p.min_p > 0 for p in params)
        self.min_p = _col([p.min_p for p in params])
        self.use_xtc = any(p.xtc_probability > 0 and p.temperature > 0 for p in params)
        self.xtc_prob = _col([p.xtc_probability for p in params])
        self.xtc_threshold = _col([p.xtc_threshold for p in params])
        self.use_p_less = any(p.p_less and p.temperature > 0 for p in params)
        self.p_less = _col([p.p_less for p in params])
        self.any_seeded = any(r.key is not None for r in randoms)

    def __call__(self, logits: mx.array) -> mx.array:
        """(penalised) ``logits`` [B, V] -> token ids [B] (lazy)."""
        if self.all_greedy:
            return mx.argmax(logits, axis=-1)
        lp = logits.astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        lp = self._truncate(lp)
        if self.use_xtc:
            lp = self._xtc(lp)
        if self.use_p_less:
            lp = self._p_less(lp)
        sampled = mx.argmax(lp * self.inv_temp + self._noise(lp.shape), axis=-1)
        if self.any_greedy:
            sampled = mx.where(self.greedy, mx.argmax(logits, axis=-1), sampled)
        return sampled

    def _truncate(self, lp: mx.array) -> mx.array:
        """top-k, top-p and min-p on the untempered distribution."""
        keep = None
        if self.use_top_k or self.use_top_p:
            ordered = -mx.sort(-lp, axis=-1)  # descending
            if self.use_top_k:
                keep = lp >= mx.take_along_axis(ordered, self.k_index, axis=-1)
            if self.use_top_p:
                probs = mx.exp(ordered)
                above = mx.cumsum(probs, axis=-1) - probs  # mass strictly above each token
                n_keep = mx.maximum(mx.sum(above < self.top_p, axis=-1, keepdims=True), 1)
                keep_p = lp >= mx.take_along_axis(ordered, n_keep - 1, axis=-1)
                keep = keep_p if keep is None else keep & keep_p
        if self.use_min_p:
            top = mx.max(lp, axis=-1, keepdims=True)
            floor = mx.where(self.min_p > 0, top + mx.log(mx.maximum(self.min_p, 1e-30)),
                             NEG_INF)
            keep = lp >= floor if keep is None else keep & (lp >= floor)
        return lp if keep is None else mx.where(keep, lp, NEG_INF)

    def _xtc(self, lp: mx.array) -> mx.array:
        """Exclude Top Choices: with probability p, drop every token above the threshold
        except the least likely of them (only when at least two are above it)."""
        probs = mx.softmax(lp, axis=-1)
        ordered = -mx.sort(-probs, axis=-1)
        above = mx.sum(ordered >= self.xtc_threshold, axis=-1, keepdims=True)
        last_above = mx.take_along_axis(ordered, mx.maximum(above - 1, 0), axis=-1)
        fire = (self._uniform() < self.xtc_prob) & (above >= 2)
        return mx.where(fire & (probs > last_above), NEG_INF, lp)

    def _p_less(self, lp: mx.array) -> mx.array:
        """Keep tokens with p >= sum(p^2) of the tempered distribution (argmax always)."""
        probs = mx.softmax(lp * self.inv_temp, axis=-1)
        floor = mx.sum(probs * probs, axis=-1, keepdims=True)
        return mx.where(self.p_less & (probs < floor), NEG_INF, lp)

    def _uniform(self) -> mx.array:
        shared = mx.random.uniform(shape=(len(self.randoms), 1))
        if not self.any_seeded:
            return shared
        return mx.stack([mx.random.uniform(shape=(1,), key=r.next()) if r.key is not None
                         else shared[i] for i, r in enumerate(self.randoms)])

    def _noise(self, shape: tuple[int, ...]) -> mx.array:
        shared = mx.random.gumbel(shape=shape)
        if not self.any_seeded:
            return shared
        return mx.stack([mx.random.gumbel(shape=shape[1:], key=r.next()) if r.key is not None
                         else shared[i] for i, r in enumerate(self.randoms)])


def logprob_arrays(logits: mx.array, sampled: mx.array, k: int) -> tuple[mx.array, ...]:
    """Chosen-token log-probability [B] and the top-``k`` alternatives ([B, k] ids, values)
    of the model's own distribution (before penalties and truncation)."""
    lp = logits.astype(mx.float32)
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, sampled[:, None].astype(mx.int32), axis=-1)[:, 0]
    if k <= 0:
        return (chosen,)
    ids = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
    vals = mx.take_along_axis(lp, ids, axis=-1)
    order = mx.argsort(-vals, axis=-1)
    return chosen, mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(vals, order, axis=-1)
