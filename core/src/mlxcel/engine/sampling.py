"""Vectorized per-row sampling over a [B, V] logits block (no Python loop over the vocab).

Chain (docs/explanation/sampling.md): penalties (repetition, frequency, presence, DRY;
engine/penalties.py) -> top-k -> top-p -> min-p -> XTC -> p-less -> temperature -> sample
(one uniform draw per row through the CDF). With top-k on every sampled row the chain runs
on the top max(k) candidates only, renormalised (as llama.cpp does). Rows with temperature 0 take the argmax of the penalised logits. A seeded
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
        self.seeded = mx.array([r.key is not None for r in randoms])
        sampled_ks = [p.top_k for p in params if p.temperature > 0]
        self.candidate_k = max(sampled_ks) if sampled_ks and all(
            0 < k < vocab_size for k in sampled_ks) else vocab_size

    def __call__(self, logits: mx.array) -> mx.array:
        """(penalised) ``logits`` [B, V] -> token ids [B] (lazy)."""
        if self.all_greedy:  # argmax needs no float32 copy of [B, V]
            return mx.argmax(logits, axis=-1)
        x = logits.astype(mx.float32)
        values, ids = self._candidates(x)
        position = self._choose(self._filter(values, ordered=ids is not None), ids)
        if ids is None:
            sampled = position
        else:
            sampled = mx.take_along_axis(ids, position[:, None], axis=-1)[:, 0]
        if self.any_greedy:
            sampled = mx.where(self.greedy, mx.argmax(x, axis=-1), sampled)
        return sampled

    def _candidates(self, x: mx.array) -> tuple[mx.array, mx.array | None]:
        """The values to sample from, best first, with their token ids; (x, None) when no
        filter needs an order. With top-k on every sampled row only the top max(k) tokens
        are kept (cheap partial selection); otherwise the whole vocabulary is sorted."""
        if not (self.use_top_k or self.use_top_p or self.use_xtc):
            return x, None
        k = self.candidate_k
        if k < self.vocab:
            ids = mx.argpartition(-x, kth=k - 1, axis=-1)[:, :k]
        else:
            ids = mx.broadcast_to(mx.arange(self.vocab)[None], x.shape)
        values = mx.take_along_axis(x, ids, axis=-1)
        order = mx.argsort(-values, axis=-1)
        return mx.take_along_axis(values, order, axis=-1), mx.take_along_axis(ids, order, axis=-1)

    def _filter(self, v: mx.array, ordered: bool) -> mx.array:
        """top-k -> top-p -> min-p -> XTC -> p-less; dropped entries become -inf."""
        if ordered and self.use_top_k:
            v = mx.where(mx.arange(v.shape[-1])[None] < self.k_index + 1, v, NEG_INF)
        if ordered and self.use_top_p:
            probs = mx.softmax(v, axis=-1)
            above = mx.cumsum(probs, axis=-1) - probs  # mass strictly above each entry
            first = mx.arange(v.shape[-1])[None] == 0
            v = mx.where((above < self.top_p) | first, v, NEG_INF)
        if self.use_min_p:
            top = mx.max(v, axis=-1, keepdims=True)
            floor = mx.where(self.min_p > 0, top + mx.log(mx.maximum(self.min_p, 1e-30)),
                             NEG_INF)
            v = mx.where(v >= floor, v, NEG_INF)
        if ordered and self.use_xtc:
            v = self._xtc(v)
        if self.use_p_less:
            v = self._p_less(v)
        return v

    def _xtc(self, v: mx.array) -> mx.array:
        """Exclude Top Choices (on best-first values): with probability p, drop every entry
        above the threshold except the least likely of them (when at least two are)."""
        probs = mx.softmax(v, axis=-1)
        above = mx.sum(probs >= self.xtc_threshold, axis=-1, keepdims=True)
        fire = (self._uniform() < self.xtc_prob) & (above >= 2)
        drop = mx.arange(v.shape[-1])[None] < above - 1
        return mx.where(fire & drop, NEG_INF, v)

    def _p_less(self, v: mx.array) -> mx.array:
        """Keep entries with p >= sum(p^2) of the tempered distribution (argmax always)."""
        probs = mx.softmax(v * self.inv_temp, axis=-1)
        floor = mx.sum(probs * probs, axis=-1, keepdims=True)
        return mx.where(self.p_less & (probs < floor), NEG_INF, v)

    def _choose(self, v: mx.array, ids: mx.array | None) -> mx.array:
        """Temperature, then one uniform draw per row through the cumulative distribution.
        Seeded rows use Gumbel-max with noise keyed by token id instead, so their draw does
        not depend on the order or number of candidates the batch happens to use."""
        scaled = v * self.inv_temp
        cdf = mx.cumsum(mx.softmax(scaled, axis=-1), axis=-1)
        u = mx.random.uniform(shape=(len(self.randoms), 1)) * cdf[:, -1:]
        position = mx.minimum(mx.sum(cdf < u, axis=-1), v.shape[-1] - 1)
        if not self.any_seeded:
            return position
        noise = []
        for i, r in enumerate(self.randoms):
            if r.key is None:
                noise.append(mx.zeros(v.shape[-1:]))
                continue
            g = mx.random.gumbel(shape=(self.vocab,), key=r.next())
            noise.append(g if ids is None else g[ids[i]])
        gumbel = mx.argmax(scaled + mx.stack(noise), axis=-1)
        return mx.where(self.seeded, gumbel, position)

    def _uniform(self) -> mx.array:
        shared = mx.random.uniform(shape=(len(self.randoms), 1))
        if not self.any_seeded:
            return shared
        return mx.stack([mx.random.uniform(shape=(1,), key=r.next()) if r.key is not None
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
