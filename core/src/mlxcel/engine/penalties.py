"""History-based logit penalties, and each row's ``logit_bias``, applied to the whole
[B, V] block at once.

Python walks each row's token *history* (bounded by its window, linear in it) to list which
tokens to penalise and, for DRY, how long each repeat is; the penalties themselves are one
scatter and a few element-wise float32 MLX ops on the batch, never a loop over the
vocabulary. Every value is clamped into float32's finite range in-graph, so no request
value that passes validation can turn a logit into inf or NaN. The logit bias comes first
(llama.cpp's chain: the bias sampler leads), one scatter of each row's biases merged per
token on the host: amounts add up, and -inf (``false``: never) wins over any amount, so
two entries for one token never make inf - inf. A banned token is set to ``BANNED``: so far
below any logit that it is never sampled while another token is possible, yet above a token
an output constraint masked out (-inf, then float32's lowest after the clamp). So when a
constraint allows banned tokens only (its end, where only EOS may follow, under
``ignore_eos``'s EOS bans), the constraint decides and the row ends as it should.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any, NamedTuple

import mlx.core as mx

from mlxcel.types import SamplingParams

FLT_MAX = 3.4028234663852886e38  # float32's largest finite value
FLT_TINY = 1.1754943508222875e-38  # float32's smallest normal value
FLOAT_MAX_LOG = 88.7228391  # ln(FLT_MAX): DRY's exponent cap is this / ln(base), as llama.cpp
NO_EXPONENT_CAP = float(2**31)  # bases this close to 1 cannot overflow before the clamp
BANNED = -1e30  # a -inf bias's logit (module docstring)


class PenaltyRow(NamedTuple):
    """One row's penalty settings, read from its SamplingParams once per composition."""

    rep: float = 1.0
    rep_window: int = 0  # 0 = whole context
    freq: float = 0.0
    pres: float = 0.0
    dry_mult: float = 0.0
    dry_base: float = 1.75
    dry_allowed: int = 2
    dry_window: int = 0  # 0 = whole context
    breakers: frozenset[int] = frozenset()
    dry_max_exp: float = NO_EXPONENT_CAP
    bias: tuple[tuple[int, float], ...] = ()  # one (token, amount) per token (merge_bias)

    @property
    def active(self) -> bool:
        return self.rep != 1.0 or bool(self.freq or self.pres) or self.dry_mult > 0 \
            or bool(self.bias)


NEUTRAL = PenaltyRow()


def _finite(value: Any, default: float) -> float:
    """``value`` as a float within float32's finite range (``default`` if not finite)."""
    v = float(value)
    return min(max(v, -FLT_MAX), FLT_MAX) if math.isfinite(v) else default


def penalty_row(p: SamplingParams) -> PenaltyRow:
    """``p``'s penalty settings, clamped so that float32 holds every derived value."""
    rep = _finite(p.repetition_penalty, 1.0)
    rep = min(max(rep, FLT_TINY), FLT_MAX) if rep > 0 else 1.0
    mult = _finite(p.dry_multiplier, 0.0)
    base = max(1.0, float(p.dry_base) if math.isfinite(float(p.dry_base)) else 1.0)
    return PenaltyRow(
        rep=rep, rep_window=max(0, int(p.repetition_context_size)),
        freq=_finite(p.frequency_penalty, 0.0), pres=_finite(p.presence_penalty, 0.0),
        dry_mult=mult if mult > 0 else 0.0, dry_base=base,
        dry_allowed=max(0, int(p.dry_allowed_length)),
        dry_window=max(0, int(p.dry_penalty_last_n)),
        breakers=frozenset(int(t) for t in p.dry_sequence_breakers),
        dry_max_exp=FLOAT_MAX_LOG / math.log(base) if base > 1.000001 else NO_EXPONENT_CAP,
        bias=merge_bias(getattr(p, "logit_bias", ())))


def merge_bias(bias: Seq[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """One amount per token, in the order tokens first appear: the amounts summed and
    clamped to float32's finite range, or -inf when any of them is."""
    merged: dict[int, float] = {}
    for token, amount in bias:
        value = float(amount)
        if math.isnan(value):
            continue
        was = merged.get(int(token), 0.0)
        merged[int(token)] = -math.inf if value == -math.inf or was == -math.inf \
            else min(max(was + value, -FLT_MAX), FLT_MAX)
    return tuple(merged.items())


def _reversed_z(s: list[int]) -> list[int]:
    """Z-array of ``s``: ``z[k]`` = length of the longest common prefix of ``s`` and
    ``s[k:]``. Linear time; positions outside the current Z-box that cannot start a match
    (``s[k] != s[0]``) are skipped with ``list.index``."""
    n = len(s)
    z = [0] * n
    first = s[0]
    left = right = 0
    k = 1
    while k < n:
        if k >= right:
            try:
                k = s.index(first, k)
            except ValueError:
                break
            length = 0
        else:
            length = min(right - k, z[k - left])
        if k + length >= right:
            while k + length < n and s[length] == s[k + length]:
                length += 1
            left, right = k, k + length
        z[k] = length
        k += 1
    return z


def dry_match_lengths(history: Seq[int], row: PenaltyRow) -> dict[int, int]:
    """DRY ("don't repeat yourself"): for each token that would extend a repeat, the
    length of its longest repeat (``>= allowed``).

    For each earlier position ``i``, the match length is how far the text before ``i``
    equals the current end of the text; token ``history[i]`` would continue that repeat.
    Matches never cross a sequence-breaker token. One Z-array over the reversed window
    gives every match length at once (as llama.cpp does), so a step costs time linear in
    the window however repetitive it is.
    """
    window = list(history[-row.dry_window:] if row.dry_window > 0 else history)
    n = len(window)
    if n < 2:
        return {}
    breakers = row.breakers
    cap = next((j for j, t in enumerate(reversed(window)) if t in breakers), n) \
        if breakers else n
    if cap < row.dry_allowed:
        return {}
    z = _reversed_z(window[::-1])
    best: dict[int, int] = {}
    allowed = row.dry_allowed
    for k in range(1, n):
        if z[k]:  # window[i - 1] equals the last token, i = n - k
            length = min(z[k], cap)
            tok = window[n - k]
            if length >= allowed and length > best.get(tok, -1):
                best[tok] = length
    return best


def dry_penalty(length: int, row: PenaltyRow) -> float:
    """The penalty of a repeat of ``length`` (host reference of the in-graph formula):
    ``multiplier * base ** min(length - allowed, max_exponent)``, at most float32's max."""
    exponent = min(length - row.dry_allowed, row.dry_max_exp)
    try:
        return min(row.dry_mult * row.dry_base ** exponent, FLT_MAX)
    except OverflowError:
        return FLT_MAX


def dry_penalties(history: Seq[int], p: SamplingParams) -> dict[int, float]:
    """Token -> DRY penalty for one history (see ``dry_match_lengths``)."""
    row = penalty_row(p)
    return {tok: dry_penalty(n, row) for tok, n in dry_match_lengths(history, row).items()}


Guard = Callable[..., Any]


def _unguarded(i: int, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Plan(NamedTuple):
    """One step's host-side penalty work: scatter coordinates (and values) per kind."""

    rep: tuple[list[int], list[int]]
    counts: tuple[list[int], list[int], list[float]]
    dry: tuple[list[int], list[int], list[int]]


def _row_plan(row: PenaltyRow, ctx: Seq[int], gen: Seq[int]) -> tuple[list, list, list]:
    rep: list[int] = []
    if row.rep != 1.0:
        rep = list(set(ctx[-row.rep_window:] if row.rep_window > 0 else ctx))
    counts = list(Counter(gen).items()) if row.freq or row.pres else []
    dry = list(dry_match_lengths(ctx, row).items()) if row.dry_mult > 0 else []
    return rep, counts, dry


class Penalties:
    """Per-row penalty settings of one batch composition."""

    def __init__(self, params: list[SamplingParams | PenaltyRow]) -> None:
        rows = [p if isinstance(p, PenaltyRow) else penalty_row(p) for p in params]
        self.rows = rows
        self.rep = mx.array([r.rep for r in rows])[:, None]
        self.freq = mx.array([r.freq for r in rows])[:, None]
        self.pres = mx.array([r.pres for r in rows])[:, None]
        self.dry_mult = mx.array([r.dry_mult for r in rows])
        self.dry_base = mx.array([min(r.dry_base, FLT_MAX) for r in rows])
        self.dry_allowed = mx.array([float(r.dry_allowed) for r in rows])
        self.dry_max_exp = mx.array([r.dry_max_exp for r in rows])
        self.bias = ([i for i, r in enumerate(rows) for _ in r.bias],
                     [t for r in rows for t, _ in r.bias], [b for r in rows for _, b in r.bias])

    def prepare(self, contexts: list[Seq[int] | None], generated: list[Seq[int]],
                guard: Guard = _unguarded) -> Plan:
        """The host side of one step (before the forward): ``contexts`` are prompt +
        generated per row (None: skip the row), ``generated`` generated only.
        ``guard(i, fn, *args)`` runs row ``i``'s walk; a row it returns None for adds
        nothing."""
        plan = Plan(([], []), ([], [], []), ([], [], []))
        for i, (row, ctx, gen) in enumerate(zip(self.rows, contexts, generated, strict=True)):
            if ctx is None or not row.active:
                continue
            got = guard(i, _row_plan, row, ctx, gen)
            if got is None:
                continue
            rep, counts, dry = got
            plan.rep[0].extend([i] * len(rep))
            plan.rep[1].extend(rep)
            for tok, count in counts:
                plan.counts[0].append(i)
                plan.counts[1].append(tok)
                plan.counts[2].append(float(count))
            for tok, length in dry:
                plan.dry[0].append(i)
                plan.dry[1].append(tok)
                plan.dry[2].append(length)
        return plan

    def apply(self, logits: mx.array, plan: Plan) -> mx.array:
        """Biased, penalised float32 logits, clamped to the finite float32 range."""
        logits = self._biased(logits.astype(mx.float32))
        rows, toks = plan.rep
        if rows:
            seen = mx.zeros(logits.shape, dtype=mx.bool_).at[mx.array(rows), mx.array(toks)].add(
                mx.array(True))
            penalised = mx.where(logits > 0, logits / self.rep, logits * self.rep)
            logits = mx.where(seen, penalised, logits)
        rows, toks, vals = plan.counts
        if rows:
            counts = mx.zeros(logits.shape).at[mx.array(rows), mx.array(toks)].add(
                mx.array(vals))
            logits = logits - self.freq * counts - self.pres * (counts > 0)
        rows, toks, lengths = plan.dry
        if rows:
            r = mx.array(rows)
            exponent = mx.minimum(mx.array(lengths, dtype=mx.float32) - self.dry_allowed[r],
                                  self.dry_max_exp[r])
            penalty = mx.minimum(self.dry_mult[r] * mx.power(self.dry_base[r], exponent),
                                 FLT_MAX)
            logits = logits.at[r, mx.array(toks)].add(-penalty)
        return mx.clip(logits, -FLT_MAX, FLT_MAX)

    def _biased(self, logits: mx.array) -> mx.array:
        """``logits`` with each row's bias added, a banned token lowered to ``BANNED``
        (ids past the logits' width dropped)."""
        width = logits.shape[-1]
        added: tuple[list[int], list[int], list[float]] = ([], [], [])
        banned: tuple[list[int], list[int]] = ([], [])
        for row, token, amount in zip(*self.bias, strict=True):
            if token >= width:
                continue
            if amount == -math.inf:
                banned[0].append(row)
                banned[1].append(token)
            else:
                for column, value in zip(added, (row, token, amount), strict=True):
                    column.append(value)
        if added[0]:
            logits = logits.at[mx.array(added[0]), mx.array(added[1])].add(
                mx.array(added[2], dtype=mx.float32))
        if banned[0]:  # never above BANNED, and a masked (-inf) token stays masked
            r, t = mx.array(banned[0]), mx.array(banned[1])
            logits[r, t] = mx.minimum(logits[r, t], BANNED)
        return logits

    def __call__(self, logits: mx.array, contexts: list[Seq[int]] | None = None,
                 generated: list[Seq[int]] | None = None, plan: Plan | None = None) -> mx.array:
        """``apply`` with ``plan``, or with ``prepare(contexts, generated)`` when none is
        given (``contexts``: prompt + generated per row)."""
        if plan is None:
            plan = self.prepare(contexts, generated)
        return self.apply(logits, plan)
