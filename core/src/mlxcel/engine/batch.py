"""The running batch and prompt prefill, on mlx-lm's batched KV caches.

Every sequence prefills its whole prompt (padded with the others admitted with it, chunk
by chunk); the last chunk also gives the logits at each row's last prompt position
(``mlxcel.engine.heads``: that column only). Joining the decode batch samples each row's
first token from them, as a decode step samples (``DecodeBatch.first_step``), and that
token is the row's next input: a short tail after a prompt-cache hit costs one forward,
not a prefill and then a decode step, and the first token does not wait for the batch's
next step.
Models on plain KV caches run on ``mlxcel.engine.cache.kvcache.BatchCache`` (``PrefillJob``,
``SharedOps``; ``rope``, from ``shared_position_rope``, selects its shared-position mode);
every other cache mix on mlx-lm's batch caches (``mlxcel.engine.mixed_batch``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import structlog
from mlx_lm.models.cache import KVCache

from mlxcel.backend import on_cuda
from mlxcel.engine import penalties as pen
from mlxcel.engine import sampling as samp
from mlxcel.engine.accel import lean_decode
from mlxcel.engine.cache.kvcache import BatchCache, KVRows, stored_rows
from mlxcel.engine.heads import Heads
from mlxcel.engine.masks import apply_masks, guided_rows
from mlxcel.engine.media_rows import shifts
from mlxcel.engine.penalties import Penalties
from mlxcel.engine.sampling import BatchSampler, logprob_arrays
from mlxcel.engine.scheduler import aligned, leave_now
from mlxcel.engine.sequence import Sequence, fail_alone
from mlxcel.engine.steps import Step

log = structlog.get_logger("mlxcel.engine")


def prefill_align() -> int:
    """Prefill column multiple: 32 on CUDA, where every new matmul shape costs a cuBLASLt
    plan (~4 ms) and every new attention shape a cuDNN plan (~50 ms) the first time, so a
    few repeated chunk shapes beat exact ones; 1 elsewhere, where padding is only cost."""
    return 32 if on_cuda() else 1


def is_batchable(model: Any) -> bool:
    """Whether ``model`` can take the shared-position ``BatchCache``: mlx-lm's standard KV
    cache, one per layer. A model with fewer caches than layers shares KV between layers
    (Gemma 3n/4), and its shared layers read the cache in ways ``BatchCache`` does not
    model; those and every other cache mix take ``mlxcel.engine.mixed_batch``."""
    cache = model.make_cache()
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is not None:  # a pipeline rank holds None for the other ranks' layers
        layers = [layer for layer in layers if layer is not None]
    if layers is not None and len(cache) != len(layers):
        return False
    return bool(cache) and all(type(c) is KVCache for c in cache)


class Prefill:
    """What every prefill job shares: its rows (``seqs``) and how many of its columns a
    step computes."""

    seqs: list[Sequence]

    @property
    def tokens_total(self) -> int:
        return sum(len(s.req.prompt_tokens) - s.cached for s in self.seqs)

    def per_row(self, chunk: int, max_cols: int | None) -> int:
        """Columns per row for a step of ``chunk`` tokens in all, at most ``max_cols``."""
        share = chunk // len(self.seqs)
        return share if max_cols is None else min(max_cols, share)


class PrefillJob(Prefill):
    """Prefills ``seqs`` a chunk per engine step; ``logits`` [B, V]: each row's at its
    prompt's last position, once done."""

    def __init__(self, model: Any, seqs: list[Sequence], batchable: bool,
                 prefixes: list[tuple[mx.array, mx.array] | None] | None = None,
                 rope: Any | None = None, align: int = 1, feed: Any = None,
                 heads: Heads | None = None) -> None:
        """``prefixes[i]``: cached (keys, values) of every layer ([layers, 1, H, n, D], a
        ``KVRows``'), whose first ``seqs[i].cached`` tokens are that prompt's, or None.
        Rows are right-aligned and every row computes the columns of the longest uncached
        tail, so a row may reuse fewer tokens than were found (``cached`` is set to what it
        reuses). ``rope``: see BatchCache.
        ``align``: the columns computed, and every chunk of them, are a multiple of it
        (more left padding, or fewer reused tokens), so chunk shapes repeat (see
        ``prefill_align``). ``feed``: media rows' chunk feeder (``media_rows.MediaFeed``;
        a group of media rows only, unaligned). ``heads``: the model's output projection
        narrowed to the last column (``Heads.for_model``; None: full logits)."""
        self.model = model
        self.feed = feed
        self.heads = heads or Heads(None)
        self.seqs = seqs
        self.batchable = batchable
        self.align = align = max(1, align) if batchable else 1  # padding needs a mask
        lengths = [len(s.req.prompt_tokens) for s in seqs]
        width = max(lengths)
        tail = aligned(max(n - s.cached for n, s in zip(lengths, seqs, strict=True)), align)
        width = max(width, tail)  # a short prompt gets extra left padding
        start = width - tail
        self.pads = pads = [width - n for n in lengths]
        for s, pad in zip(seqs, pads, strict=True):
            s.cached = max(0, start - pad)
        if not batchable:
            self.cache = model.make_cache()
        elif start > 0:
            parts = [pre if pre and s.cached else None
                     for s, pre in zip(seqs, prefixes, strict=True)]
            self.cache = BatchCache.from_prefixes(parts, pads, start, rope)
        else:
            self.cache = [BatchCache(pads, rope) for _ in model.make_cache()]
        if batchable:
            # the group's cache holds its prompts only: joining copies it into the batch's
            # buffer anyway, so a 256-slot growth step would only hold memory while a burst
            # prefills (64 rows of 64 tokens on a Llama-3-8B shape: ~2.1 GB, not ~0.5 GB).
            # A lone row's buffer becomes the batch's own when it joins an empty batch (an
            # agent's next turn): it gets room for its decode steps, or the first of them
            # would copy its whole cache to grow it
            room = BatchCache.step if len(seqs) == 1 else 0
            for c in self.cache:
                c.reserve = width + room
        # the columns still to compute (from ``start``): a prompt-cache hit's prefix is
        # never fed, and a long prompt's ids cost a list and an array to copy
        rows = [[0] * max(0, pad - start)
                + list(s.req.prompt_tokens[max(0, start - pad):])
                for s, pad in zip(seqs, pads, strict=True)]
        self.tokens = mx.array(rows, dtype=mx.uint32)
        self.start = start
        self.width = width
        self.done_cols = start
        self.last_cols = 0  # columns the last step() computed
        self.logits: mx.array | None = None

    def step(self, chunk: int, max_cols: int | None = None) -> bool:
        """Run one chunk (``chunk`` tokens in all, at most ``max_cols`` per row); True when
        the prompts are in the cache."""
        if self.done_cols < self.width:
            cols = max(self.align, self.per_row(chunk, max_cols) // self.align * self.align)
            end = min(self.width, self.done_cols + cols)
            chunk = self.tokens[:, self.done_cols - self.start:end - self.start]
            done_cols = self.done_cols

            def forward() -> mx.array:
                if self.feed is not None:  # media rows: column c is row r's c - pads[r]
                    return self.feed(chunk, self.cache, [done_cols - p for p in self.pads])
                return self.model(chunk, self.cache)

            if end < self.width:
                forward()  # its logits are never evaluated
            else:  # rows are right-aligned: the last column is every prompt's last token
                self.logits = self.heads.logits(forward, None)
                if self.batchable:
                    for c in self.cache:  # padding all rows share (alignment) needs no mask
                        c.trim()
            mx.eval([c.state for c in self.cache],
                    *([self.logits] if self.logits is not None else []))
            self.last_cols = end - self.done_cols
            self.done_cols = end
        return self.done_cols >= self.width


class DecodeBatch:
    """Rows decoding together: one forward per step over [B, 1] inputs."""

    def __init__(self, model: Any, vocab_size: int, lazy_leave: bool = False,
                 ops: Any = None, forward: Any = None) -> None:
        """``ops``: how the caches join, filter and are copied out (``SharedOps`` for
        ``BatchCache``, ``mixed_batch.MixedOps``). ``forward``: tokens [B] and the caches ->
        logits [B, V] (``mlxcel.engine.accel.lean_decode``; default the model's own).
        ``lazy_leave`` (CUDA): a finished row stays in the batch, decoding tokens nobody
        reads, until finished rows outnumber the others or a group joins (whose merge
        copies the batch anyway). Dropping a row copies every other row's cache: on an
        H200 a step after 7 of 64 rows left took 58 ms to queue instead of ~5, while a
        decode step's cost hardly depends on its row count there."""
        self.model = model
        self.forward = forward or lean_decode.generic(model)
        self.vocab = vocab_size
        self.lazy_leave = lazy_leave
        self.ops = ops or SharedOps
        self.steps = 0  # decode steps built; a row's cache holds fed(row) tokens
        self.rows: list[Sequence] = []  # finished ones included until they are dropped
        self.cache: list[Any] | None = None
        self.inputs: mx.array | None = None  # [B] next input token per row (lazy)
        self.sampler: BatchSampler | None = None
        self.penalties: Penalties | None = None
        self.top_logprobs = -1  # -1: no row wants logprobs
        self.top: tuple[int, ...] = ()  # per row (Step.top)
        self.guided = False  # some row has an output constraint (``masks``)
        self.share: Any = None  # --distributed: sampled -> rank 0's sampled, in the graph
        self.shift: mx.array | None = None  # rows' position shifts (``media_rows.shifts``)

    def __len__(self) -> int:
        """Rows still decoding for a request."""
        return sum(not s.finished for s in self.rows)

    def __bool__(self) -> bool:
        """Whether a row still decodes for a request (stops at the first one)."""
        return any(not s.finished for s in self.rows)

    def join(self, jobs: list[PrefillJob]) -> Step:
        """Prefilled groups become rows: one cache merge per layer for all of them (which
        also drops the finished rows ``lazy_leave`` kept). Returns their first tokens'
        step (``first_step``, lazy): the caller hands them out (``read_back``)."""
        seqs = [s for job in jobs for s in job.seqs]
        first = self.first_step(seqs, mx.concatenate([job.logits for job in jobs]))
        caches = [job.cache for job in jobs]
        keep = [i for i, s in enumerate(self.rows) if not s.finished]
        if self.cache is not None and not keep:
            self.rows, self.cache, self.inputs = [], None, None
        if self.cache is None:
            self.cache, self.inputs = caches[0], first.sampled
            caches, keep = caches[1:], None
        else:
            if len(keep) == len(self.rows):
                keep = None
            else:
                self.inputs = self.inputs[mx.array(keep)]
                self.rows = [self.rows[i] for i in keep]
            self.inputs = mx.concatenate([self.inputs, first.sampled])
        if caches or keep is not None:
            self.ops.join(self.cache, caches, keep)
        for s in seqs:  # it holds all of its prompt; its first token is the next input
            s.fed_from = len(s.req.prompt_tokens) - self.steps
        self.rows.extend(seqs)
        self.sampler = self.penalties = None
        return first

    def first_step(self, seqs: list[Sequence], logits: mx.array) -> Step:
        """The first tokens of ``seqs`` from ``logits`` [B, V] (their prompts' last
        positions), sampled as a decode step samples them: the rows' own settings,
        constraints, penalties and logprobs, each row guarded."""
        first = DecodeBatch(self.model, self.vocab, forward=self.forward)
        first.rows, first.share = list(seqs), self.share
        plan, guided = first.prepare()
        sampled, extras = first.sample(logits, plan, guided)
        return Step(first.rows, sampled, extras, first.top)

    def fed(self, seq: Sequence) -> int:
        """Tokens of ``seq.context`` its row's cache holds: all of it, or all but the last
        sampled token when the step that feeds that one was not built yet."""
        return seq.fed_from + self.steps

    def snapshots(self, seqs: list[Sequence]) -> list[tuple[list[int], Any]]:
        """Each row's cached state for the prompt cache, with the tokens it holds."""
        return self.ops.snapshots(self, seqs)

    def drop_finished(self) -> None:
        """Finished rows leave, or with ``lazy_leave`` stay until they are the majority or
        a group joins (``scheduler.leave_now``)."""
        keep = [i for i, s in enumerate(self.rows) if not s.finished]
        if not leave_now(len(self.rows) - len(keep), len(self.rows), self.lazy_leave):
            return
        if not keep:
            self.rows, self.cache, self.inputs = [], None, None
            self.sampler = self.penalties = None
            return
        self.ops.filter(self.cache, keep)
        self.inputs = self.inputs[mx.array(keep)]
        self.rows = [self.rows[i] for i in keep]
        self.sampler = self.penalties = None

    @property
    def needs_sync(self) -> bool:
        """Penalties and output constraints read the previous token, so steps cannot
        overlap; a batch with neither keeps overlapping them."""
        return self.penalties is not None or self.guided

    def _compose(self) -> None:
        """Per-row settings first, each row guarded (``fail_alone``): a row whose params
        cannot be read fails alone and decodes with neutral settings until it is dropped."""
        rows = []
        for seq in self.rows:
            got = fail_alone(seq, _row_settings, seq.req.sampling, self.vocab)
            rows.append(got or (samp.NEUTRAL, pen.NEUTRAL))
        self.sampler = BatchSampler([r[0] for r in rows], [s.random for s in self.rows],
                                    self.vocab)
        self.penalties = Penalties([r[1] for r in rows]) if any(r[1].active for r in rows) \
            else None
        self.top = tuple(r[0].top_logprobs for r in rows)
        self.top_logprobs = max(self.top, default=-1)
        self.guided = any(s.matcher is not None for s in self.rows)
        self.shift = shifts(self.rows)

    def _guard(self, i: int, fn: Any, *args: Any) -> Any:
        return fail_alone(self.rows[i], fn, *args)

    def launch(self) -> Step:
        """Build one decode step for every row; the caller queues it (``Step.start``).

        All per-row host work (composition, penalty walks) runs before the forward, each row
        guarded: the forward advances every row's KV cache, so a row failing after it could
        not be retried without decoding the others twice. A failed row gets neutral values
        for this step and leaves with the finished rows."""
        plan, guided = self.prepare()
        # media rows: their decoder shifts their positions (``media_rows``)
        logits = self.forward(self.inputs, self.cache) if self.shift is None \
            else self.forward(self.inputs, self.cache, self.shift)
        self.steps += 1  # every row's cache takes one more token
        sampled, extras = self.sample(logits, plan, guided)
        self.inputs = sampled
        return Step(list(self.rows), sampled, extras, self.top)

    def prepare(self) -> tuple[Any, list[int]]:
        """The step's per-row host work: composition, penalty walks, constrained rows."""
        if self.sampler is None:
            self._compose()
        plan = None
        if self.penalties is not None:
            plan = self.penalties.prepare([None if s.finished else s.context for s in self.rows],
                                          [s.generated_ids for s in self.rows], self._guard)
        return plan, guided_rows(self.rows) if self.guided else []

    def sample(self, logits: mx.array, plan: Any, guided: list[int]
               ) -> tuple[mx.array, tuple[mx.array, ...]]:
        """Logits [B, V] -> the sampled tokens [B] and their logprob arrays: constraints,
        penalties (``plan``), then each row's sampler."""
        scored = apply_masks(logits, self.rows, guided, self._guard) if guided else logits
        scored = scored if plan is None else self.penalties(scored, plan=plan)
        sampled = self.sampler(scored).astype(mx.uint32)
        if self.share is not None:
            sampled = self.share(sampled)
        extras = logprob_arrays(logits, sampled, self.top_logprobs) \
            if self.top_logprobs >= 0 else ()
        return sampled, extras


class SharedOps:
    """What ``DecodeBatch`` does to ``BatchCache`` layers."""

    @staticmethod
    def join(cache: list[Any], parts: list[list[Any]], keep: list[int] | None) -> None:
        for mine, *theirs in zip(cache, *parts, strict=True):
            mine.extend(*theirs, keep=keep)

    @staticmethod
    def filter(cache: list[Any], keep: list[int]) -> None:
        for c in cache:
            c.filter(keep)

    @staticmethod
    def snapshots(batch: DecodeBatch, seqs: list[Sequence]) -> list[tuple[list[int], KVRows]]:
        """Each row's keys/values for all of its context but the last (sampled, never
        fed) token, all layers stacked, in the canonical frame (``kvcache.stored_rows``);
        queued together (``mx.async_eval``: the engine does not wait for the copies, and
        whatever reads them later waits for them as MLX arrays do)."""
        idx = [batch.rows.index(s) for s in seqs]
        out = stored_rows(batch.cache, idx, [len(s.context) - 1 for s in seqs])
        mx.async_eval([a for rows in out for a in (rows.keys, rows.values)])
        return [(s.context[:-1], rows) for s, rows in zip(seqs, out, strict=True)]


def _row_settings(p: Any, vocab: int) -> tuple[samp.RowSampling, pen.PenaltyRow]:
    return samp.row_sampling(p, vocab), pen.penalty_row(p)
