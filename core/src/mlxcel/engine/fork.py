"""n choices of one prompt (``n`` > 1): submitted together, prefilled once.

A request for n choices is n ``GenerationRequest`` s with the same prompt (each with its own
seed). ``submit_choices`` hands them to the engine thread as one ``Fork`` item, so they
arrive together; the first becomes the *leader* and the others its *followers*
(``link``). The scheduler takes a leader's followers into its prefill group with it
(``scheduler.form_group``), and only the leader's row is computed: when its prefill is
done, ``ForkedPrefill`` copies that row's cache once per follower, so the n rows join the
decode batch together, each then sampling on its own. The prompt is computed once, as
llama-server does for ``n_cmpl`` (a child slot waits for its parent's prompt, then
copies its state).

Where rows cannot share a cache (a media prompt, a distributed engine, a model that
decodes one row at a time), the n requests run as independent rows instead.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import mlx.core as mx

from mlxcel.engine.batch import PrefillJob
from mlxcel.engine.cache.kinds import arrays, is_lone
from mlxcel.engine.mixed_batch import MixedPrefill, merge_rows
from mlxcel.errors import MemoryBudgetExceeded, Overloaded
from mlxcel.types import GenerationEvent, GenerationRequest
from mlxcel.types.events import PromptProgress


class Fork:
    """One inbox item: the requests of n choices and their event streams, in order."""

    __slots__ = ("members",)

    def __init__(self, members: list[tuple[GenerationRequest, Any]]) -> None:
        self.members = members


def submit_choices(client: Any, reqs: list[GenerationRequest]) -> list[Any]:
    """Admit the n choices of one request together, or refuse them all at once (503 when
    the queue cannot take n more, the memory budget when n rows do not fit); their event
    streams, in order."""
    if len(reqs) == 1:
        return [client.submit(reqs[0])]
    _ = client.checkpoint  # raises while loading / after a failed load
    free = client.parallel - client.active_count
    if client.queue_depth + len(reqs) > max(client.max_queue_depth, free):
        raise Overloaded("All slots are busy. Please try again later.")
    budget = client.worker.memory_budget
    estimated = sum(client.estimate_bytes(req) for req in reqs)
    if estimated > budget:
        raise MemoryBudgetExceeded(estimated, budget)
    from mlxcel.engine.client import EventStream  # the client imports the worker

    loop = asyncio.get_running_loop()
    streams = [EventStream(client, req, loop) for req in reqs]
    worker = client.worker
    worker.requests.put(Fork(list(zip(reqs, streams, strict=True))),
                        lambda: f"engine stopped: {worker.error or 'shut down'}")
    worker.count_queued(len(reqs) - 1)  # the inbox counted the item once
    return streams


def link(seqs: list[Any]) -> None:
    """The first sequence leads, the others follow it (their rows copy its prefill)."""
    leader = seqs[0]
    leader.followers = list(seqs[1:])
    for seq in seqs[1:]:
        seq.leader = leader


def unlink(seq: Any) -> None:
    """``seq`` runs as an independent row from now on (its leader could not take it)."""
    leader = getattr(seq, "leader", None)
    if leader is not None:
        leader.followers = [f for f in leader.followers if f is not seq]
        seq.leader = None


def computing(group: list[Any]) -> list[Any]:
    """The rows of ``group`` whose prompts are computed: all but the followers whose
    leader is in the group."""
    members = set(map(id, group))
    return [s for s in group if getattr(s, "leader", None) is None
            or id(s.leader) not in members]


class ForkedPrefill:
    """A prefill job (``PrefillJob`` or ``MixedPrefill``) over a group's computing rows,
    seen with the whole group (``seqs``: each leader followed by its followers): when it
    is done, each follower gets a copy of its leader's cache row, in ``seqs`` order, so
    the group joins the decode batch like one prefilled together."""

    def __init__(self, job: Any, group: list[Any]) -> None:
        self.job = job
        rows = {id(s): r for r, s in enumerate(job.seqs)}
        self.seqs: list[Any] = []
        self.index: list[int] = []
        for seq in job.seqs:
            for member in (seq, *(f for f in getattr(seq, "followers", ()) if f in group)):
                self.seqs.append(member)
                self.index.append(rows[id(seq)])
        self.expanded = False

    def __getattr__(self, name: str) -> Any:  # the inner job's other attributes
        return getattr(self.job, name)

    @property
    def cache(self) -> Any:
        return self.job.cache

    @property
    def logits(self) -> Any:
        """[B, V] of the whole group: each follower its leader's last-position logits."""
        return self.job.logits[mx.array(self.index, dtype=mx.int32)]

    def step(self, chunk: int, max_cols: int | None = None) -> bool:
        done = self.job.step(chunk, max_cols)
        if done and not self.expanded:
            self._expand()
        return done

    def _expand(self) -> None:
        """Copy the leaders' cache rows for their followers (a gather along the batch
        axis; a lone row on plain caches is merged n times into batch caches)."""
        self.expanded = True
        for seq, r in zip(self.seqs, self.index, strict=True):
            lead = self.job.seqs[r]
            if seq is not lead:
                seq.cached, seq.cache_hit = lead.cached, lead.cache_hit
                seq.prompt_hashes = lead.prompt_hashes  # the same prompt
        job = self.job
        if isinstance(job, MixedPrefill) and is_lone(job.cache):
            job.cache[:] = merge_rows([job.cache] * len(self.seqs))
            job.lone = False
        elif isinstance(job, PrefillJob):
            for c in job.cache:
                c.filter(self.index)
        else:
            index = mx.array(self.index, dtype=mx.int32)
            for c in job.cache:
                c.filter(index)
        mx.eval(arrays(job.cache))


def _row(job: Any, seq: Any) -> Any:
    """The sequence whose row ``seq``'s prompt is computed in: its leader's in a fork."""
    lead = seq.leader
    inner = job.job if isinstance(job, ForkedPrefill) else job
    return lead if lead is not None and lead in inner.seqs else seq


def processed(job: Any, row: Any) -> int:
    """Prompt tokens of ``row`` (a computed row of ``job``) in its cache so far, its
    cached prefix included."""
    inner = job.job if isinstance(job, ForkedPrefill) else job
    n = len(row.req.prompt_tokens)
    if isinstance(inner, PrefillJob):  # rows right-aligned at ``width`` columns
        return max(row.cached, min(n, inner.done_cols - (inner.width - n)))
    return min(n, row.cached + inner.done_cols)  # tails left-aligned after the prefix


def report_progress(job: Any, started: float, done: bool) -> None:
    """Tell each row of ``job`` when its prefill started (``started``: the served totals
    count the prompt's seconds from there), and send a progress event to each row that
    asked for one. Once the prefill is done every prompt token is processed, as
    llama-server's last report has it."""
    ms = int((time.perf_counter() - started) * 1e3)
    for seq in job.seqs:
        seq.prefill_started(started)
        if seq.req.return_progress and not seq.finished:
            row = _row(job, seq)
            total = len(seq.req.prompt_tokens)
            seq.emit(GenerationEvent(progress=PromptProgress(
                total=total, cache=row.cached,
                processed=total if done else processed(job, row), time_ms=ms)))
