"""History-based logit penalties, applied to the whole [B, V] block at once.

Python walks each row's token *history* (bounded by its window) to list which tokens to
penalise; the penalties themselves are one scatter and a few element-wise MLX ops on the
batch, never a loop over the vocabulary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as Seq

import mlx.core as mx

from mlxcel.types import SamplingParams


def dry_penalties(history: Seq[int], p: SamplingParams) -> dict[int, float]:
    """DRY ("don't repeat yourself"): penalise tokens that would extend a repeat.

    For each earlier position ``i``, the match length is how far the text before ``i``
    equals the current end of the text; token ``history[i]`` would continue that repeat.
    Only positions right after an earlier occurrence of the last token can match, so just
    those are walked back. Matches never cross a sequence-breaker token. Penalty:
    ``multiplier * base ** (length - allowed_length)`` for ``length >= allowed_length``.
    """
    window = list(history[-p.dry_penalty_last_n:] if p.dry_penalty_last_n > 0 else history)
    n = len(window)
    if n < 2:
        return {}
    breakers = set(p.dry_sequence_breakers)
    cap = next((j for j, t in enumerate(reversed(window)) if t in breakers), n)
    last = window[-1]
    best: dict[int, int] = {}
    for i in [j + 1 for j, t in enumerate(window[:-1]) if t == last]:
        length = 1
        while length < min(i, cap) and window[i - 1 - length] == window[n - 1 - length]:
            length += 1
        length = min(length, cap)
        if length >= p.dry_allowed_length and length > best.get(window[i], -1):
            best[window[i]] = length
    return {tok: p.dry_multiplier * p.dry_base ** (length - p.dry_allowed_length)
            for tok, length in best.items()}


class Penalties:
    """Per-row penalty settings of one batch composition."""

    def __init__(self, params: list[SamplingParams]) -> None:
        self.params = params
        self.rep = mx.array([p.repetition_penalty for p in params])[:, None]
        self.freq = mx.array([p.frequency_penalty for p in params])[:, None]
        self.pres = mx.array([p.presence_penalty for p in params])[:, None]
        self.any_rep = any(p.repetition_penalty != 1.0 for p in params)
        self.any_count = any(p.frequency_penalty or p.presence_penalty for p in params)
        self.any_dry = any(p.dry_multiplier > 0 for p in params)

    def __call__(self, logits: mx.array, contexts: list[Seq[int]],
                 generated: list[Seq[int]]) -> mx.array:
        """``contexts``: prompt + generated per row; ``generated``: generated only."""
        logits = logits.astype(mx.float32)
        shape = logits.shape
        if self.any_rep:
            rows, toks = [], []
            for i, (p, ctx) in enumerate(zip(self.params, contexts, strict=True)):
                if p.repetition_penalty != 1.0:
                    window = ctx[-p.repetition_context_size:] if p.repetition_context_size > 0 \
                        else ctx
                    uniq = set(window)
                    rows += [i] * len(uniq)
                    toks += uniq
            if rows:
                seen = mx.zeros(shape, dtype=mx.bool_).at[mx.array(rows), mx.array(toks)].add(
                    mx.array(True))
                penalised = mx.where(logits > 0, logits / self.rep, logits * self.rep)
                logits = mx.where(seen, penalised, logits)
        if self.any_count:
            logits = self._counts(logits, generated)
        if self.any_dry:
            logits = self._dry(logits, contexts)
        return logits

    def _counts(self, logits: mx.array, generated: list[Seq[int]]) -> mx.array:
        rows, toks, vals = [], [], []
        for i, (p, gen) in enumerate(zip(self.params, generated, strict=True)):
            if p.frequency_penalty or p.presence_penalty:
                for tok, count in Counter(gen).items():
                    rows.append(i)
                    toks.append(tok)
                    vals.append(float(count))
        if not rows:
            return logits
        counts = mx.zeros(logits.shape).at[mx.array(rows), mx.array(toks)].add(mx.array(vals))
        return logits - self.freq * counts - self.pres * (counts > 0)

    def _dry(self, logits: mx.array, contexts: list[Seq[int]]) -> mx.array:
        rows, toks, vals = [], [], []
        for i, (p, ctx) in enumerate(zip(self.params, contexts, strict=True)):
            if p.dry_multiplier > 0:
                for tok, penalty in dry_penalties(ctx, p).items():
                    rows.append(i)
                    toks.append(tok)
                    vals.append(penalty)
        if not rows:
            return logits
        return logits.at[mx.array(rows), mx.array(toks)].add(-mx.array(vals))
