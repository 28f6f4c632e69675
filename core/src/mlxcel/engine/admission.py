"""Admission, executed: requests move from the inbox to the waiting heap, and the plan's
decisions (``mlxcel.engine.scheduler``) become prefill jobs, prefill steps and joins.

``Admission`` is a mixin of ``EngineWorker`` and works on its state (``waiting``,
``prefilling``, ``prefilled``, ``batch``, the prompt cache); the decisions themselves are
the scheduler's, pure Python, and the worker module holds the loop and the decode steps.
"""

from __future__ import annotations

import heapq
import queue
import time
from typing import Any

import structlog

from mlxcel.engine import fork, scheduler
from mlxcel.engine.batch import PrefillJob
from mlxcel.engine.cache.capture import marks_for
from mlxcel.engine.cache.entries import prompt_hashes
from mlxcel.engine.media_rows import MediaFeed
from mlxcel.engine.mixed_batch import MixedPrefill
from mlxcel.engine.scheduler import Limits, Plan, View
from mlxcel.engine.sequence import Sequence, Sink, error_event, fail_alone
from mlxcel.engine.steps import read_back
from mlxcel.types import GenerationRequest

log = structlog.get_logger("mlxcel.engine")


class Admission:
    """The worker's admission methods (see the module docstring)."""

    waiting: list[Sequence]
    prefilling: PrefillJob | None
    prefilled: list[PrefillJob]
    batch: Any
    inbox: queue.Queue
    prompt_cache: Any
    checkpoint: Any
    dist: Any
    batchable: bool
    heads: Any  # the output projection at each row's last column (``engine.heads``)
    _prefill_started = 0.0  # when the prefilling group started (its progress reports)

    def _drain(self, block: bool, timeout: float = 0.5) -> int:
        """Move submitted requests to the waiting heap; how many arrived. ``block`` waits
        up to ``timeout`` seconds for the first."""
        arrived = 0
        if not block and not self.inbox.queue:  # the usual busy step: nothing arrived
            return 0  # (an item put right after this is taken next iteration)
        try:
            item = self.inbox.get(timeout=timeout) if block else self.inbox.get_nowait()
            while True:
                for seq in self._arrivals(item):
                    heapq.heappush(self.waiting, seq)
                    arrived += 1
                item = self.inbox.get_nowait()
        except queue.Empty:
            return arrived

    def _arrivals(self, item: Any) -> list[Sequence]:
        """An inbox item's sequences: none (a wake-up), one request's, or a fork's n
        choices (``engine.fork``), linked where their rows can share one prefill."""
        if item is None:
            return []
        if not isinstance(item, fork.Fork):
            seq = self._sequence(*item)
            return [] if seq is None else [seq]
        seqs = [s for s in (self._sequence(*m) for m in item.members) if s is not None]
        if len(seqs) > 1 and self._forks_share(seqs[0]):
            fork.link(seqs)
        return seqs

    def _forks_share(self, seq: Sequence) -> bool:
        """Whether a fork's rows can copy one prefill: rows of batch caches, of a prompt
        without media, on one process."""
        return self.batchable and seq.req.media is None and not self.dist.active

    def _sequence(self, req: GenerationRequest, sink: Sink) -> Sequence | None:
        """A submitted request as a Sequence; one that cannot be built fails alone."""
        try:
            return Sequence(req, sink, self.checkpoint.tokenizer, self.eos_ids,
                            next(self._order))
        except Exception as exc:
            log.exception("request_failed", request_id=getattr(req, "request_id", None))
            self.count_queued(-1)
            sink.emit(error_event(f"generation failed: {type(exc).__name__}: {exc}"))
            return None

    # -- the plan ----------------------------------------------------------------------------
    def _limits(self) -> Limits:
        p = self.policy
        return Limits(parallel=self.parallel, prefill_chunk=self.prefill_chunk,
                      align=self.align, grouped=self.grouped,
                      media_grouped=self.media_grouped, burst_chunks=self.burst_chunks,
                      hold_groups=p.hold_groups and self.batchable,
                      lazy_leave=self.batch.lazy_leave)

    def _view(self) -> View:
        return View(waiting=self.waiting, rows=self.batch.rows,
                    prefilling=self.prefilling.seqs if self.prefilling else None,
                    held=[job.seqs for job in self.prefilled])

    def _plan(self) -> Plan:
        return scheduler.schedule(self._view(), self._limits(), self._tail)

    def _cancel(self, plan: Plan) -> None:
        """Sequences whose consumer went away leave at once (waiting, prefilling, held,
        decoding); so do a prefilling group and held groups with no live row left."""
        for seq in plan.cancel:
            seq.finish("cancelled")
        gone = sum(s.finished for s in self.waiting)
        if gone:
            self.count_queued(-gone)
            self.waiting = [s for s in self.waiting if not s.finished]
            heapq.heapify(self.waiting)
        if plan.drop_job:
            self.dist.dropped_job()
            self.prefilling = None
        self.prefilled = [job for job in self.prefilled if not all(s.finished for s in job.seqs)]

    def _lookup(self, seq: Sequence) -> tuple | None:
        if seq.cache_hit is None:
            found = None
            cache, tokens = self.prompt_cache, seq.req.prompt_tokens
            try:
                if seq.req.cache_prompt and cache.enabled:
                    digests = dict(seq.req.media_digests)
                    seq.prompt_hashes = prompt_hashes(tokens, digests)
                    found = cache.lookup(tokens, digests, seq.prompt_hashes)
            except Exception:  # the cache's problem, not the request's: a miss
                log.exception("prompt_cache_lookup_failed", request_id=seq.req.request_id)
            seq.cache_hit = found or ()
        return seq.cache_hit or None

    def _tail(self, seq: Sequence) -> int:
        """Prompt tokens ``seq`` must compute (past its prompt-cache hit, if any)."""
        hit = self._lookup(seq)
        seq.cached = hit.n if hit else 0
        return len(seq.req.prompt_tokens) - seq.cached

    def _free(self) -> int:
        return scheduler.free_slots(self._limits(), self._view())

    def _budget(self, free: int) -> int:
        return scheduler.budget(self._limits(), free, len(self.waiting), len(self.batch))

    def _admit(self, plan: Plan | None = None) -> PrefillJob | MixedPrefill | None:
        """Start prefilling the plan's group (the next waiting request(s); a plan made now
        when none is given): they leave the waiting heap, and a prompt-cache hit reuses its
        cached prefix (see PrefillJob)."""
        plan = plan or self._plan()
        if not plan.group:
            return None
        self.budget = plan.budget
        taken = set(map(id, plan.group))
        self.waiting = [s for s in self.waiting if id(s) not in taken]
        heapq.heapify(self.waiting)
        return self._start(list(plan.group))

    def _start(self, group: list[Sequence]) -> PrefillJob | None:
        """The group's PrefillJob. If it cannot be built, each row is tried alone: the rows
        that fail alone finish with an error, the others wait again to be admitted alone
        (``solo``), so one request cannot fail its group."""
        try:
            job = self._new_job(group)
        except Exception:
            log.exception("prefill_setup_failed", request_ids=[s.req.request_id for s in group])
            for seq in group:
                fork.unlink(seq)  # alone now: it computes its own prompt
                if fail_alone(seq, self._new_job, [seq]) is None:
                    self.count_queued(-1)
                else:
                    seq.solo = True
                    heapq.heappush(self.waiting, seq)
            return None
        self.stats.sequences_started += len(group)
        self.prefilling = job
        self._prefill_started = time.perf_counter()
        fork.report_progress(job, self._prefill_started, done=False)
        self.dist.admitted(group)
        self.count_queued(-len(group))
        return job

    def _new_job(self, group: list[Sequence]) -> Any:
        """The group's prefill job; a group holding a fork's followers computes its
        other rows only and copies their rows at the end (``fork.ForkedPrefill``)."""
        rows = fork.computing(group)
        job = self._rows_job(rows)
        return job if len(rows) == len(group) else fork.ForkedPrefill(job, group)

    def _rows_job(self, group: list[Sequence]) -> PrefillJob | MixedPrefill:
        hits = [s.cache_hit or None for s in group]
        model = self.checkpoint.model
        # media rows group with media rows only (``scheduler``); their padded columns
        # get zero embeddings (``media_rows.MediaFeed``), so they align as text rows do
        media = group[0].req.media is not None
        align = self.align
        if self.path == "mixed":
            starts = [hit.state().caches if hit is not None and s.cached else None
                      for s, hit in zip(group, hits, strict=True)]
            marks = [self._marks(s) for s in group]
            job: PrefillJob | MixedPrefill = MixedPrefill(
                model, group, starts, self.merge, align, marks,
                feed=self._feed(group, media), heads=self.heads)
            return job
        prefixes = [(hit.payload.keys, hit.payload.values) if hit is not None else None
                    for hit in hits]
        return PrefillJob(model, group, self.batchable, prefixes, self.rope, align,
                          feed=self._feed(group, media), heads=self.heads)

    def _feed(self, group: list[Sequence], media: bool) -> MediaFeed | None:
        return MediaFeed(self.checkpoint.model, group, self.features,
                         self.policy.media_together) if media else None

    def _marks(self, seq: Sequence) -> list[tuple[int, str]]:
        """The checkpoints ``seq`` takes while it prefills (``cache.capture.marks_for``):
        none where nothing may keep them (the prompt cache is off for it, its model's
        caches can all be cut back, or the ranks of a distributed engine would have to
        agree on them)."""
        cache = self.prompt_cache
        if not (seq.req.cache_prompt and cache.enabled and cache.reuse.mode != "prefix") \
                or self.dist.active:
            return []
        return marks_for(len(seq.req.prompt_tokens), seq.cached, seq.req.cache_marks,
                         self.checkpoint_interval)

    def _prefill_step(self, plan: Plan) -> None:
        if self.prefilling is None:
            self.prefilling = self._admit(plan)
            if self.prefilling is None:
                self._join_prefilled()  # nothing starts prefilling: held groups join
                return
        job = self.prefilling
        self.dist.prefill(self.budget, self.prefill_chunk)  # the other ranks run it too
        try:
            done = self.trace.timed("prefill_ms",
                                    lambda: job.step(self.budget, self.prefill_chunk))
        except Exception as exc:
            if self.dist.active:  # the ranks' caches may now differ: the engine stops
                raise
            log.exception("prefill_failed", request_ids=[s.req.request_id for s in job.seqs])
            self.prefilling = None
            self.buffers.requested = True  # the failure may have been for want of memory
            if len(job.seqs) > 1:
                self._alone_again(job.seqs)
                return
            for seq in job.seqs:
                seq.finish("error", error=f"prefill failed: {exc}")
            return
        self.stats.prefill_chunks_processed += 1
        if self.spec is not None:  # not a decode step's cost
            self.spec.batch.interrupted()
        self.buffers.dirty = self.buffers.prefilled = True
        self.trace.note(prefill_rows=len(job.seqs), prefill_cols=job.last_cols)
        fork.report_progress(job, self._prefill_started, done)
        if done:
            self.prefilling = None
            self.stats.total_prefill_tokens += job.tokens_total
            self.prefilled.append(job)
            if not (plan.hold or self._hold_for_arrivals()):
                self._join_prefilled()

    def _alone_again(self, seqs: list[Sequence]) -> None:
        """The rows of a group whose prefill failed wait again, each to prefill alone
        (``solo``), from the start: one row's input (an image the tower cannot take) or a
        group too large for memory fails that row alone, never its group."""
        for seq in seqs:
            if seq.finished:
                continue
            fork.unlink(seq)  # alone now: it computes its own prompt
            seq.solo = True
            seq.checkpoints = []
            seq.position_shift = 0
            self.stats.sequences_started -= 1  # counted again when it starts
            self.count_queued(1)
            heapq.heappush(self.waiting, seq)

    def _hold_for_arrivals(self) -> bool:
        """Whether the group that just finished prefilling waits after all, because
        requests arrived while it prefilled (``scheduler.hold_group`` on them): a burst
        that reaches the server over more than one prefill (the HTTP side takes each
        request in turn) then joins the batch in one join, not one per group, and every
        join costs the batch a copy and a step on new shapes where groups are held."""
        arrived = self._drain(block=False) if self.policy.hold_groups else 0
        if not arrived:
            return False
        self.trace.note(arrived_prefilling=arrived)
        view, limits = self._view(), self._limits()
        following = min((s for s in self.waiting if not s.finished and not s.sink.cancelled),
                        default=None)
        if following is None:
            return False
        decoding = len(self.batch)
        free = scheduler.free_slots(limits, view)
        return scheduler.hold_group(limits, self._tail(following), free, len(view.held),
                                    decoding)

    def _join_prefilled(self) -> None:
        """Held and just-prefilled groups join the batch, and their first tokens (sampled
        from their prompts' last logits, ``DecodeBatch.join``) go out at once: the rows
        that finish with it are settled (stored) while still rows, then leave."""
        if self.prefilled:
            jobs, self.prefilled = self.prefilled, []
            self.dist.joined()
            first = self.trace.timed("join_ms", lambda: self.batch.join(jobs))
            done = self.trace.timed("first_ms", lambda: read_back(first, self.stats))
            self.deliveries.flush()  # the first tokens go out before the next step's work
            self._settle(done)
            self.dist.dropped()
            self.batch.drop_finished()  # rows that finished, or whose client left
            self.trace.note(joined=sum(len(job.seqs) for job in jobs))
