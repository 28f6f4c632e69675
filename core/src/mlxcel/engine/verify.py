"""A speculative verify step: every row of the batch in one forward, drafting or not.

Row i feeds ``[last_i, d_i1 .. d_ik]``, right-padded to the batch's widest draft. Position
j's logits give the token the target itself produces after ``d_i1 .. d_ij``: the batch's
own chain at every position, each row as a one-token step would see it there (``Chain``):
its output constraint in the state after ``d_i1 .. d_ij`` (``constraints.speculate``), its
penalties over its tokens plus ``d_i1 .. d_ij``, its logit bias, then its sampler. A row
keeps its drafts up to the first one that differs from the target's token there, and then
that token (the "bonus"): the output is exactly what decoding one token per step would
give, greedy or sampled, since each kept token is the target's own draw given the tokens
before it. A draft token the constraint forbids is cut before the forward (it could not
be kept), and counts as drafted and rejected.

A seeded row's key chain advances once per kept token, as one-token steps advance it, so
a seeded request gives the same output with and without speculation.

The caches then forget each row's rejected positions (``BatchCache.rollback``), so every
row's cache holds its context but the bonus token, which is the next step's input. The
kept tokens go to the rows one by one (``Sequence.accept``), so stop strings, EOS, the
matcher's own state and logprobs are handled as after one-token steps; a row that ends
inside its kept tokens takes none after the end.

For a drafter that reads the target's hidden states, the forward's own (the final norm's
output, ``mlxcel.drafters.hidden``) go to ``Speculation.kept`` and the session's commit.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.engine.accel.staged import staged
from mlxcel.engine.batch import DecodeBatch
from mlxcel.engine.cache.rollback import begin_verify
from mlxcel.engine.constraints.protocol import mask_words
from mlxcel.engine.constraints.speculate import draft_masks
from mlxcel.engine.sequence import Sequence, fail_alone
from mlxcel.engine.speculative import Speculation
from mlxcel.engine.steps import row_logprobs
from mlxcel.engine.trace import NullTrace


class _Position:
    """One verify position's sampled tokens [B] and logprob arrays, with the per-row
    top-k counts ``row_logprobs`` reads."""

    def __init__(self, sampled: mx.array, logprobs: tuple[mx.array, ...],
                 top: tuple[int, ...]) -> None:
        self.sampled, self.logprobs, self.top = sampled, logprobs, top


def verify_step(batch: DecodeBatch, drafts: list[list[int]], spec: Speculation,
                stats: Any, trace: NullTrace, stages: int) -> list[Sequence]:
    """Run one verify step for ``batch`` (whose previous step was read back) with each
    row's draft (``[]``: none); hand the kept tokens to the rows. Returns the rows that
    finished, their finish events held (``Sequence.defer_finish``) as ``read_back`` does.
    ``trace``: the engine trace, which notes the step's phases (``verify_chain_ms``: the
    host's work before the forward; ``verify_graph_ms``: building the forward's graph;
    ``verify_sync_ms``: computing it, and what earlier steps left lazy, up to the tokens'
    read-back; ``verify_post_ms``: acceptance, rollback and hand-out). ``stages``: the
    forward is queued to the device in this many parts as it is built, and the
    rollback as soon as it is known (``EnginePolicy.verify_stages``)."""
    started = time.perf_counter()
    mark = trace.lap()
    rows = list(batch.rows)
    chain = Chain(batch, drafts)  # the host work, before the forward
    fed = chain.fed
    width = 1 + max(len(d) for d in fed)
    inputs = mx.array([[s.context[-1], *d, *[0] * (width - 1 - len(d))]
                       for s, d in zip(rows, fed, strict=True)], dtype=mx.uint32)
    begin_verify(batch.model, batch.cache, inputs)  # mixed path: each layer's rollback
    mark = trace.lap("verify_chain_ms", mark)
    with staged(batch.cache, stages):
        logits = batch.model(inputs, batch.cache)  # [B, width, V]
    mark = trace.lap("verify_graph_ms", mark)
    states = spec.tap.take() if spec.tap is not None else None  # needs_hidden: [B, width, H]
    keys = [s.random.key for s in rows]
    positions, chains = [], []
    if chain.argmax_only:  # every position's tokens in one op
        picked = mx.argmax(logits, axis=-1).astype(mx.uint32)  # [B, width]
        positions = [_Position(picked[:, j], (), batch.top) for j in range(width)]
        chains = [keys] * width
        tokens = picked.tolist()
    else:
        for j in range(width):
            sampled, extras = chain.sample(logits[:, j, :], j)
            positions.append(_Position(sampled, extras, batch.top))
            chains.append([s.random.key for s in rows])
        mx.eval([p.sampled for p in positions], [p.logprobs for p in positions])
        tokens = mx.stack([p.sampled for p in positions], axis=1).tolist()  # [B, width]
    mark = trace.lap("verify_sync_ms", mark)
    accepted = []
    for i, draft in enumerate(fed):
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
    if stages > 1:  # the device rolls back while the host hands out and drafts
        mx.async_eval([a for c in batch.cache for a in c.state if a is not None])
    for seq, n in zip(rows, accepted, strict=True):
        seq.fed_from += n
    batch.steps += 1
    batch.inputs = mx.array([t[n] for t, n in zip(tokens, accepted, strict=True)],
                            dtype=mx.uint32)
    # the counters first: a row that finishes below reports them in its usage
    emitted = sum(n + 1 for s, n in zip(rows, accepted, strict=True) if not s.finished)
    spec.kept(rows, states, accepted)
    spec.settle(rows, drafts, accepted, time.perf_counter() - started, emitted, states)
    stats.draft_rounds += sum(1 for d in drafts if d)
    stats.draft_tokens += sum(len(d) for d in drafts)
    stats.draft_accepted += sum(n for d, n in zip(drafts, accepted, strict=True) if d)
    try:
        return _hand_out(rows, tokens, accepted, positions, stats)
    finally:
        trace.lap("verify_post_ms", mark)


class Chain:
    """Each verify position's logits chain, row by row as a one-token step there would
    run it (module docstring). Built before the forward: the batch's composition, every
    constrained row's masks over its draft (``fed``: each draft cut to what its constraint
    allows), and the penalty walks of each position."""

    def __init__(self, batch: DecodeBatch, drafts: list[list[int]]) -> None:
        self.batch = batch
        rows = batch.rows
        plan, guided = batch.prepare()
        guard = lambda i, fn, *args: fail_alone(rows[i], fn, *args)  # noqa: E731
        self.fed = [list(d) for d in drafts]
        self.guided = guided
        self.masks: np.ndarray | None = None  # [guided rows, positions, words]
        self.reach = 0  # positions a guided row's mask applies to
        if guided:
            depth = 1 + max(len(self.fed[i]) for i in guided)
            # the built-in backends' compiled constraints know their mask width, which
            # exceeds the tokenizer's count where its ids have gaps
            words = max([mask_words(batch.vocab)]
                        + [getattr(rows[i].req.guide, "words", 0) for i in guided])
            self.masks = np.full((len(guided), depth, words), -1, dtype=np.int32)
            for k, i in enumerate(guided):
                taken = guard(i, draft_masks, rows[i].matcher, self.fed[i], self.masks[k])
                self.fed[i] = self.fed[i][:taken or 0]
            self.reach = 1 + max(len(self.fed[i]) for i in guided)
        self.plans = [plan]
        if batch.penalties is not None:
            for j in range(1, 1 + max(len(d) for d in self.fed)):
                walk = [s.context + d[:j] if len(d) >= j and not s.finished else None
                        for s, d in zip(rows, self.fed, strict=True)]
                gen = [s.generated_ids + d[:j] for s, d in zip(rows, self.fed, strict=True)]
                self.plans.append(batch.penalties.prepare(walk, gen, guard))

    @property
    def argmax_only(self) -> bool:
        """Every row greedy, with no constraint, penalty, logit bias, logprobs or shared
        choice: each position's token is its logits' argmax, which one op gives for all
        positions (the per-position chain would give the same, in ~4 ops a position)."""
        batch = self.batch
        return (batch.sampler.all_greedy and batch.penalties is None and not self.guided
                and batch.top_logprobs < 0 and batch.share is None)

    def sample(self, logits: mx.array, j: int) -> tuple[mx.array, tuple[mx.array, ...]]:
        """Position ``j``'s logits [B, V] -> its sampled tokens [B] and logprob arrays."""
        batch = self.batch
        scored = logits if j >= self.reach else _masked(logits, self._words(j, logits.shape))
        if batch.penalties is not None:
            scored = batch.penalties(scored, plan=self.plans[j])
        sampled = batch.sampler(scored).astype(mx.uint32)
        if batch.share is not None:
            sampled = batch.share(sampled)
        return sampled, _logprobs(batch, logits, sampled)

    def _words(self, j: int, shape: tuple[int, int]) -> np.ndarray:
        """Position ``j``'s mask words [B, W] for logits of ``shape``: each guided row's,
        no id past its vocabulary (as its matcher writes it); every id for the others."""
        rows, words = shape[0], mask_words(shape[1])
        out = np.full((rows, words), -1, dtype=np.int32)
        n = min(words, self.masks.shape[-1])
        out[self.guided, :n] = self.masks[:, j, :n]
        out[self.guided, n:] = 0
        return out


def _masked(logits: mx.array, words: np.ndarray) -> mx.array:
    """``logits`` [B, V] with what the mask words [B, W] disallow at -inf (as
    ``masks.apply_masks``)."""
    batch, width = logits.shape
    bits = (mx.array(words)[:, :, None] >> mx.arange(32, dtype=mx.int32)) & 1
    allowed = bits.reshape(batch, -1)[:, :width].astype(mx.bool_)
    return mx.where(allowed, logits, mx.array(-float("inf"), dtype=logits.dtype))


def _logprobs(batch: DecodeBatch, logits: mx.array, sampled: mx.array) -> tuple[mx.array, ...]:
    from mlxcel.engine.sampling import logprob_arrays

    return logprob_arrays(logits, sampled, batch.top_logprobs) if batch.top_logprobs >= 0 \
        else ()


def _hand_out(rows: list[Sequence], tokens: list[list[int]], accepted: list[int],
              positions: list[_Position], stats: Any) -> list[Sequence]:
    """Each row's kept tokens, in order, until it finishes (as ``steps.read_back``)."""
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
