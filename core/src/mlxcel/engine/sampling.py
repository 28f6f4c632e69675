"""Vectorized per-row sampling over a [B, V] logits block (no Python loop over the vocab).

Chain (docs/explanation/sampling.md): penalties (repetition, frequency, presence, DRY;
engine/penalties.py) -> top-k -> top-p -> min-p -> XTC -> p-less -> temperature -> sample
(one uniform draw per row through the CDF). With top-k on every sampled row the chain runs
on the top max(k) candidates only, renormalised (as llama.cpp does). Rows with temperature 0 take the argmax of the penalised logits. A seeded
row draws its randomness from its own key chain, so its output does not depend on the
other rows in the batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mlx.core as mx

from mlxcel.engine.penalties import FLT_MAX, FLT_TINY
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


class RowSampling(NamedTuple):
    """One row's sampler settings, read from its SamplingParams once per composition."""

    greedy: bool = True
    inv_temp: float = 1.0
    top_k: int = 0  # 0: off (k >= the vocabulary is off too)
    top_p: float = 1.0
    min_p: float = 0.0
    xtc_prob: float = 0.0
    xtc_threshold: float = 0.1
    p_less: bool = False
    top_logprobs: int = -1  # -1: no logprobs


NEUTRAL = RowSampling()


def _unit(value: Any) -> float:
    """A probability-like setting; anything outside [0, 1] (NaN included) reads as 0."""
    v = float(value)
    return v if 0 <= v <= 1 else 0.0


def row_sampling(p: SamplingParams, vocab_size: int) -> RowSampling:
    """``p``'s sampler settings, clamped so that float32 holds every derived value: a
    temperature so small or large that ``1/t`` leaves float32's normal range is taken at
    that range's edge."""
    t = float(p.temperature)
    greedy = not t > 0
    inv_temp = 1.0 if greedy else min(max(1.0 / max(t, 1.0 / FLT_MAX), FLT_TINY), FLT_MAX)
    k = int(p.top_k)
    top_p = float(p.top_p)
    logprobs = min(max(0, int(p.top_logprobs)), vocab_size) if p.logprobs else -1
    return RowSampling(
        greedy=greedy, inv_temp=inv_temp, top_k=k if 0 < k < vocab_size else 0,
        top_p=top_p if 0 < top_p < 1 else 1.0, min_p=_unit(p.min_p),
        xtc_prob=_unit(p.xtc_probability) if not greedy else 0.0,
        xtc_threshold=_unit(p.xtc_threshold), p_less=bool(p.p_less) and not greedy,
        top_logprobs=logprobs)


class BatchSampler:
    """Samples one token per row; built once per batch composition."""

    def __init__(self, params: list[SamplingParams | RowSampling], randoms: list[RowRandom],
                 vocab_size: int) -> None:
        rows = [p if isinstance(p, RowSampling) else row_sampling(p, vocab_size)
                for p in params]
        self.randoms = randoms
        self.vocab = vocab_size
        self.all_greedy = all(r.greedy for r in rows)
        self.any_greedy = any(r.greedy for r in rows)
        self.greedy = mx.array([r.greedy for r in rows])
        self.inv_temp = _col([r.inv_temp for r in rows])
        ks = [r.top_k or vocab_size for r in rows]
        self.use_top_k = any(r.top_k for r in rows)
        self.k_index = _col([k - 1 for k in ks])
        self.use_top_p = any(r.top_p < 1 for r in rows)
        self.top_p = _col([r.top_p for r in rows])
        self.use_min_p = any(r.min_p > 0 for r in rows)
        self.min_p = _col([r.min_p for r in rows])
        self.use_xtc = any(r.xtc_prob > 0 for r in rows)
        self.xtc_prob = _col([r.xtc_prob for r in rows])
        self.xtc_threshold = _col([r.xtc_threshold for r in rows])
        self.use_p_less = any(r.p_less for r in rows)
        self.p_less = _col([r.p_less for r in rows])
        self.any_seeded = any(r.key is not None for r in randoms)
        self.seeded = mx.array([r.key is not None for r in randoms])
        sampled_ks = [r.top_k for r in rows if not r.greedy]
        self.candidate_k = max(sampled_ks) if sampled_ks and all(sampled_ks) else vocab_size

    def __call__(self, logits: mx.array) -> mx.array:
        """(penalised) ``logits`` [B, V] -> token ids [B] (lazy)."""
        if self.all_greedy:  # argmax needs no float32 copy of [B, V]
            return mx.argmax(logits, axis=-1)
        x = logits.astype(mx.float32)
        values, ids = self._candidates(x)
        position = self._choose(self._filter(values, ordered=ids is not None), ids,
                                x.shape[-1])
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
        width = x.shape[-1]  # the model's output width: it may pass the tokenizer's vocabulary
        if k < width:
            ids = mx.argpartition(-x, kth=k - 1, axis=-1)[:, :k]
        else:
            ids = mx.broadcast_to(mx.arange(width)[None], x.shape)
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
        probs = mx.softmax(self._tempered(v), axis=-1)
        floor = mx.sum(probs * probs, axis=-1, keepdims=True)
        return mx.where(self.p_less & (probs < floor), NEG_INF, v)

    def _choose(self, v: mx.array, ids: mx.array | None, width: int) -> mx.array:
        """Temperature, then one uniform draw per row through the cumulative distribution.
        Seeded rows use Gumbel-max with noise keyed by token id instead, so their draw does
        not depend on the order or number of candidates the batch happens to use."""
        scaled = self._tempered(v)
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
            g = mx.random.gumbel(shape=(width,), key=r.next())
            noise.append(g if ids is None else g[ids[i]])
        gumbel = mx.argmax(scaled + mx.stack(noise), axis=-1)
        return mx.where(self.seeded, gumbel, position)

    def _tempered(self, v: mx.array) -> mx.array:
        """``v / t`` shifted so that each row's best entry is 0: the scaling then cannot
        overflow into inf - inf (NaN) however small ``t`` is, and softmax and argmax do not
        change under the shift."""
        return (v - mx.max(v, axis=-1, keepdims=True)) * self.inv_temp

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
