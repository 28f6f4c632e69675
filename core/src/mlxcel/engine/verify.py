"""A speculative verify step: every row of the batch in one forward, drafting or not.

Row i feeds ``[last_i, d_i1 .. d_ik]``, right-padded to the batch's widest draft. Position
j's logits give the token the target itself produces after ``d_i1 .. d_ij``: the batch's
own chain (constraints and penalties at position 0, where only non-drafting rows have
them; then each row's sampler) at every position. A row keeps its drafts up to the first
one that differs from the target's token there, and then that token (the "bonus"): the
output is exactly what decoding one token per step would give, greedy or sampled, since
each kept token is the target's own draw given the tokens before it.

A seeded row's key chain advances once per kept token, as one-token steps advance it, so
a seeded request gives the same output with and without speculation.

The caches then forget each row's rejected positions (``BatchCache.rollback``), so every
row's cache holds its context but the bonus token, which is the next step's input.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from mlxcel.engine.batch import DecodeBatch, row_logprobs
from mlxcel.engine.cache.rollback import begin_verify
from mlxcel.engine.sequence import Sequence
from mlxcel.engine.speculative import Speculation


class _Position:
    """One verify position's sampled tokens [B] and logprob arrays, with the per-row
    top-k counts ``row_logprobs`` reads."""

    def __init__(self, sampled: mx.array, logprobs: tuple[mx.array, ...],
                 top: tuple[int, ...]) -> None:
        self.sampled, self.logprobs, self.top = sampled, logprobs, top


def verify_step(batch: DecodeBatch, drafts: list[list[int]], spec: Speculation,
                stats: Any) -> list[Sequence]:
    """Run one verify step for ``batch`` (whose previous step was read back) with each
    row's draft (``[]``: none); hand the kept tokens to the rows. Returns the rows that
    finished, their finish events held (``Sequence.defer_finish``) as ``read_back`` does."""
    started = time.perf_counter()
    rows = list(batch.rows)
    width = 1 + max(len(d) for d in drafts)
    inputs = mx.array([[s.context[-1], *d, *[0] * (width - 1 - len(d))]
                       for s, d in zip(rows, drafts, strict=True)], dtype=mx.uint32)
    plan, guided = batch.prepare()
    begin_verify(batch.model, batch.cache, inputs)  # mixed path: each layer's rollback
    logits = batch.model(inputs, batch.cache)  # [B, width, V]
    keys = [s.random.key for s in rows]
    positions, chains = [], []
    for j in range(width):
        if j == 0:
            sampled, extras = batch.sample(logits[:, 0, :], plan, guided)
        else:  # drafting rows only read these: they have no constraint nor penalty
            sampled = batch.sampler(logits[:, j, :]).astype(mx.uint32)
            extras = _logprobs(batch, logits[:, j, :], sampled)
        positions.append(_Position(sampled, extras, batch.top))
        chains.append([s.random.key for s in rows])
    mx.eval([p.sampled for p in positions], [p.logprobs for p in positions])
    tokens = mx.stack([p.sampled for p in positions], axis=1).tolist()  # [B, width]
    accepted = []
    for i, draft in enumerate(drafts):
        n = 0
        while n < len(draft) and tokens[i][n] == draft[n]:
            n += 1
        accepted.append(n)
    for i, seq in enumerate(rows):  # each key chain as if it had made 1 + n draws
        if keys[i] is not None:
            seq.random.key = chains[accepted[i]][i]
    drops = [width - 1 - n for n in accepted]
    for c in batch.cache:
        c.rollback(drops)
    for seq, n in zip(rows, accepted, strict=True):
        seq.fed_from += n
    batch.steps += 1
    batch.inputs = mx.array([t[n] for t, n in zip(tokens, accepted, strict=True)],
                            dtype=mx.uint32)
    # the counters first: a row that finishes below reports them in its usage
    emitted = sum(n + 1 for s, n in zip(rows, accepted, strict=True) if not s.finished)
    spec.settle(rows, drafts, accepted, time.perf_counter() - started, emitted)
    stats.draft_rounds += sum(1 for d in drafts if d)
    stats.draft_tokens += sum(len(d) for d in drafts)
    stats.draft_accepted += sum(n for d, n in zip(drafts, accepted, strict=True) if d)
    return _hand_out(rows, tokens, accepted, positions, stats)


def _logprobs(batch: DecodeBatch, logits: mx.array, sampled: mx.array) -> tuple[mx.array, ...]:
    from mlxcel.engine.sampling import logprob_arrays

    return logprob_arrays(logits, sampled, batch.top_logprobs) if batch.top_logprobs >= 0 \
        else ()


def _hand_out(rows: list[Sequence], tokens: list[list[int]], accepted: list[int],
              positions: list[_Position], stats: Any) -> list[Sequence]:
    """Each row's kept tokens, in order, until it finishes (as ``batch.read_back``)."""
    per_position = [row_logprobs(p, len(rows)) if p.logprobs else None for p in positions]
    done: list[Sequence] = []
    taken = 0
    for i, seq in enumerate(rows):
        if seq.finished:
            continue
        seq.defer_finish = True
        for j in range(accepted[i] + 1):
            lp = per_position[j][i] if per_position[j] is not None \
                and seq.req.sampling.logprobs else None
            try:
                seq.accept(tokens[i][j], lp)
            except Exception as exc:
                seq.finish("error", error=f"generation failed: {exc}")
            taken += 1
            if seq.finished:
                break
        if seq.finished:
            done.append(seq)
        else:
            seq.release_finish()
    stats.total_decode_tokens += taken
    stats.sequences_completed += len(done)
    return done
