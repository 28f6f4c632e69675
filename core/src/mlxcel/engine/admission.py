"""Admission, the scheduling half of the engine thread: requests move from the inbox to the
waiting heap, from there, grouped by priority and token budget, into prefill jobs, and once
prefilled, into the decode batch.

``Admission`` is a mixin of ``EngineWorker`` and works on its state (``waiting``,
``prefilling``, ``prefilled``, ``batch``, the prompt cache); it is kept apart so that the
worker module holds the loop and the execution of steps.
"""

from __future__ import annotations

import heapq
import queue
from typing import Any

import structlog

from mlxcel.engine.batch import PrefillJob, aligned
from mlxcel.engine.mixed_batch import MixedPrefill
from mlxcel.engine.sequence import Sequence, Sink, error_event, fail_alone
from mlxcel.types import GenerationRequest

log = structlog.get_logger("mlxcel.engine")

MAX_DEFERRED = 8  # prefilled groups held back to join together while rows decode


class Admission:
    """The worker's admission methods (see the module docstring)."""

    waiting: list[Sequence]
    prefilling: PrefillJob | None
    prefilled: list[PrefillJob]
    batch: Any
    inbox: queue.Queue
    prompt_cache: Any
    checkpoint: Any

    def _drain(self, block: bool) -> int:
        """Move submitted requests to the waiting heap; how many arrived."""
        arrived = 0
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            while True:
                if item is not None:
                    seq = self._sequence(*item)
                    if seq is not None:
                        heapq.heappush(self.waiting, seq)
                        arrived += 1
                item = self.inbox.get_nowait()
        except queue.Empty:
            return arrived

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

    def _drop_cancelled(self) -> None:
        """Sequences whose consumer went away leave at once (waiting, prefilling, decoding)."""
        for seq in [*self.waiting, *self.active]:
            if seq.sink.cancelled:
                seq.finish("cancelled")
        gone = sum(s.finished for s in self.waiting)
        if gone:
            self.count_queued(-gone)
            self.waiting = [s for s in self.waiting if not s.finished]
            heapq.heapify(self.waiting)
        if self.prefilling and all(s.finished for s in self.prefilling.seqs):
            self.prefilling = None
        self.prefilled = [job for job in self.prefilled if not all(s.finished for s in job.seqs)]

    def _lookup(self, seq: Sequence) -> tuple | None:
        if seq.cache_hit is None:
            found = None
            try:
                found = self.prompt_cache.lookup(seq.req.prompt_tokens) \
                    if seq.req.cache_prompt else None
            except Exception:  # the cache's problem, not the request's: a miss
                log.exception("prompt_cache_lookup_failed", request_id=seq.req.request_id)
            seq.cache_hit = found or ()
        return seq.cache_hit or None

    def _tail(self, seq: Sequence) -> int:
        """Prompt tokens ``seq`` must compute (past its prompt-cache hit, if any)."""
        hit = self._lookup(seq)
        seq.cached = hit[1] if hit else 0
        return len(seq.req.prompt_tokens) - 1 - seq.cached

    def _admit(self) -> PrefillJob | None:
        """Start prefilling the next waiting request(s), grouped (right-aligned) while
        rows x the longest uncached tail fit in the step's token budget (``_budget``); a
        prompt-cache hit reuses its cached prefix (see PrefillJob)."""
        free = self._free()
        if not self.waiting or free <= 0:
            return None
        self.budget = budget = self._budget(free)
        group = [heapq.heappop(self.waiting)]
        widest = aligned(self._tail(group[0]), self.align)
        while self.waiting and len(group) < free and self.grouped \
                and not group[0].solo and not self.waiting[0].solo:
            tail = max(widest, aligned(self._tail(self.waiting[0]), self.align))
            if (len(group) + 1) * min(tail, self.prefill_chunk) > budget:
                break
            group.append(heapq.heappop(self.waiting))
            widest = tail
        return self._start(group)

    def _budget(self, free: int) -> int:
        """Prefill tokens per step: the prefill chunk, or on CUDA, where a burst of
        requests arrives at rows that are few (W waiting that fit, R decoding), up to
        ``EnginePolicy.burst_chunks`` chunks (W // R of them), each row still at most one chunk's
        columns per step. Rows of prefilled groups held back to join (``_defer_join``) do
        not count: they decode nothing yet, and wait for the next groups either way.

        A wide prefill group costs less per row than a narrow one, and every group costs
        the running rows a step's wait and the batch a join, so a burst reaches full speed
        sooner in few wide groups; the few running rows wait longer for one step instead
        (docs/explanation/batching.md, "Bursts"). A long prompt arriving alone still
        prefills a chunk per step between decode steps.
        """
        if self.burst_chunks <= 1:
            return self.prefill_chunk
        arriving = min(free, len(self.waiting))
        return self.prefill_chunk * max(1, min(self.burst_chunks,
                                               arriving // max(1, len(self.batch))))

    def _free(self) -> int:
        """Slots neither decoding nor taken by a prefilled group waiting to join."""
        return self.parallel - len(self.batch) - sum(
            not s.finished for job in self.prefilled for s in job.seqs)

    def _start(self, group: list[Sequence]) -> PrefillJob | None:
        """The group's PrefillJob. If it cannot be built, each row is tried alone: the rows
        that fail alone finish with an error, the others wait again to be admitted alone
        (``solo``), so one request cannot fail its group."""
        try:
            job = self._new_job(group)
        except Exception:
            log.exception("prefill_setup_failed", request_ids=[s.req.request_id for s in group])
            for seq in group:
                if fail_alone(seq, self._new_job, [seq]) is None:
                    self.count_queued(-1)
                else:
                    seq.solo = True
                    heapq.heappush(self.waiting, seq)
            return None
        self.stats.sequences_started += len(group)
        self.prefilling = job
        self.count_queued(-len(group))
        return job

    def _new_job(self, group: list[Sequence]) -> PrefillJob | MixedPrefill:
        hits = [s.cache_hit[0].payload if s.cache_hit else None for s in group]
        if self.path == "mixed":
            starts = [hit.prefix(s.cached).caches if hit is not None and s.cached else None
                      for s, hit in zip(group, hits, strict=True)]
            return MixedPrefill(self.checkpoint.model, group, starts, self.merge)
        prefixes = [(hit.keys, hit.values) if hit is not None else None for hit in hits]
        return PrefillJob(self.checkpoint.model, group, self.batchable, prefixes, self.rope,
                          self.align)

    def _defer_join(self) -> bool:
        """Hold prefilled groups back so that several join in one merge while the next
        waiting request can start prefilling at once and fits one chunk.

        Every join copies the whole batch cache into a new buffer and the next step runs
        new shapes (tens of ms on CUDA), so a burst of arrivals joining group by group
        slows every running stream once per group. While nothing decodes, groups are
        prefilled back to back and join together; while rows decode (and wait for the
        join's copy), at most ``MAX_DEFERRED`` groups are held, since each one held costs
        the held rows a step. Only on CUDA (``EnginePolicy.hold_groups``): elsewhere a join is a cheap
        copy and holding would only delay the first groups' first tokens (CPU, 16 requests
        at once: TTFT p50 is the median group's, not the last one's).
        """
        if not self.policy.hold_groups or not self.waiting or not self.batchable or self._free() <= 0:
            return False
        if self.batch and len(self.prefilled) >= MAX_DEFERRED:
            return False
        return aligned(self._tail(self.waiting[0]), self.align) <= self.prefill_chunk

    def _prefill_step(self) -> None:
        if self.prefilling is None:
            self.prefilling = self._admit()
            if self.prefilling is None:
                self._join_prefilled()
                return
        job = self.prefilling
        try:
            done = self.trace.timed("prefill_ms", lambda: job.step(self.budget, self.prefill_chunk))
        except Exception as exc:
            log.exception("prefill_failed", request_ids=[s.req.request_id for s in job.seqs])
            for seq in job.seqs:
                seq.finish("error", error=f"prefill failed: {exc}")
            self.prefilling = None
            return
        self.stats.prefill_chunks_processed += 1
        self._dirty = True
        self.trace.note(prefill_rows=len(job.seqs), prefill_cols=job.last_cols)
        if done:
            self.prefilling = None
            self.stats.total_prefill_tokens += job.tokens_total
            self.prefilled.append(job)
            if not self._defer_join():
                self._join_prefilled()

    def _join_prefilled(self) -> None:
        if self.prefilled:
            jobs, self.prefilled = self.prefilled, []
            self.trace.timed("join_ms", lambda: self.batch.join(jobs))
            self.batch.drop_finished()  # rows whose client left while they were held
            self.trace.note(joined=sum(len(job.seqs) for job in jobs))
