"""The job lane: one-shot MLX work (an embedding batch, a rerank batch, later a transcription
or an image) run on an engine thread between decode steps.

Each task has its own bounded queue (``LaneLimits.depth`` jobs, else ``Overloaded``: 503)
and timeout (``RequestTimedOut``: 504). Jobs of one task with equal ``key`` are batched
together, up to ``batch_items`` items per run, so requests that arrive together share one
forward; tasks take turns. While streams decode, side jobs get at most ``SIDE_SHARE`` of the
engine thread's time (``run_due``, ``mlxcel.engine.parts.TimeShare``), so a flood of
embeddings stretches decoding by a bounded factor, and runs back to back once nothing
decodes.

Gathering (``due_in``, which the engine thread waits out when nothing decodes): while a task's jobs
arrive faster than two per forward (its last ``DENSE_ARRIVALS`` submits fell within its
last batch's time), a batch that is not full waits for more, until one forward time (at
most ``GATHER_MAX_S``) after that batch ended, or until it is full. A forward costs the
engine thread its graph building, under the GIL the HTTP side needs to take requests in,
and a launch-bound GPU forward costs about the same for 1 row as for 16: one-item batches
back to back would spend the thread on forwards instead of on intake. Jobs that arrive
slower than that would not fill a batch in the wait, and a lone client never waits.

Overlap (``run_one``): a runner may queue its batch on the device and return a ``Later``
(``mlxcel.families.tasks``). While batches follow each other with nothing decoding, each
is read only after the next one is built and queued, so the device computes one while the
thread builds the next. At most one batch is in flight, and none across a decode step or
an idle wait (``settle``).

``trace`` (``--engine-trace``) gets one line per batch: items, jobs, how long its oldest
job queued (``wait_ms``), the HTTP side's time from the request to its submit
(``intake_ms``), building and queuing it (``side_ms``), reading it (``read_ms``) or the
batch before it (``read_prev_ms``), and the longest hand-back to a caller since the last
line, from a batch's end to the caller running again (``deliver_ms``).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import msgspec
import structlog

from mlxcel.engine.parts import TimeShare
from mlxcel.engine.trace import NullTrace
from mlxcel.errors import GenerationFailed, MlxcelError, Overloaded, RequestTimedOut
from mlxcel.families.tasks import Later

log = structlog.get_logger("mlxcel.engine.lanes")
SIDE_SHARE = 0.1  # of the engine thread's time while streams decode
GATHER_MAX_S = 0.01  # the longest a batch that is not full waits for more jobs
DENSE_ARRIVALS = 3  # submits that must fall within one forward time for a batch to gather


class LaneLimits(msgspec.Struct, frozen=True, kw_only=True):
    """A task's queue: at most ``depth`` jobs admitted and unfinished, each answered within
    ``timeout_s`` seconds, run ``batch_items`` items at a time."""

    depth: int = 8
    timeout_s: float = 120.0
    batch_items: int = 16


class Job:
    """One request's items of one task. ``fn(batch)`` runs on the engine thread and returns
    one result per item of ``batch``, which may hold items of other jobs of equal ``key``.
    ``since``: when its request arrived (``perf_counter``), for the trace."""

    __slots__ = ("task", "key", "items", "fn", "results", "next", "done_count", "deadline",
                 "cancelled", "since", "submitted", "settled", "_loop", "_future")

    def __init__(self, task: str, key: Hashable, items: list[Any],
                 fn: Callable[[list[Any]], list[Any]], since: float | None = None) -> None:
        self.task, self.key, self.items, self.fn = task, key, list(items), fn
        self.since = since
        self.submitted = self.settled = 0.0  # perf_counter
        self.results: list[Any] = [None] * len(self.items)
        self.next = 0  # the first item not yet taken into a batch
        self.done_count = 0
        self.deadline = 0.0
        self.cancelled = False  # the caller gave up (timeout or disconnect)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[list[Any]] | None = None

    def _settle(self, result: list[Any] | None, error: BaseException | None) -> None:
        """Hand the outcome to the caller's event loop (from the engine thread)."""
        self.settled = time.perf_counter()
        fut, loop = self._future, self._loop
        if fut is None or loop is None:
            return

        def deliver() -> None:
            if not fut.done():
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result or [])

        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop is gone: nobody waits for this job any more
            pass


class JobLane:
    """The engine-thread side: queued jobs by task, taken a batch at a time (``run_one``).
    ``submit`` is called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Job]] = {}
        self._open: dict[str, int] = {}  # admitted, unfinished jobs per task
        self._turn: deque[str] = deque()  # tasks in the order they get the next batch
        self._limits: dict[str, LaneLimits] = {}
        self.closed: str | None = None  # why the lane takes no more jobs
        self.turns = TimeShare(SIDE_SHARE)  # while streams decode
        self._arrivals: dict[str, deque[float]] = {}  # the last submits' times, per task
        self._last_batch: dict[str, tuple[float, float]] = {}  # task -> (end, seconds)
        self._delivered: list[float] = []  # hand-back times (ms) not yet traced
        self.trace: NullTrace = NullTrace()  # --engine-trace (mlxcel.engine.trace)
        self._inflight: tuple[list[tuple[Job, int]], list[Job], Later] | None = None

    def pending(self) -> bool:
        return any(self._queues.values())

    def open_jobs(self, task: str) -> int:
        return self._open.get(task, 0)

    def submit(self, job: Job, limits: LaneLimits) -> None:
        """Queue ``job``, or raise ``Overloaded`` when its task holds ``limits.depth`` jobs."""
        with self._lock:
            if self.closed is not None:
                raise GenerationFailed(self.closed)
            if self._open.get(job.task, 0) >= limits.depth:
                raise Overloaded(f"the {job.task} queue is full ({limits.depth} requests); "
                                 "try again later")
            self._open[job.task] = self._open.get(job.task, 0) + 1
            job.submitted = time.perf_counter()
            self._arrivals.setdefault(job.task, deque(maxlen=DENSE_ARRIVALS)).append(
                job.submitted)
            self._limits[job.task] = limits
            queue = self._queues.setdefault(job.task, deque())
            if job.task not in self._turn:
                self._turn.append(job.task)
            queue.append(job)

    def due_in(self) -> float:
        """Seconds until the next batch should run: 0 for now, ``math.inf`` with nothing
        queued, else how long a batch that is not full still gathers (module docstring)."""
        now = time.perf_counter()
        with self._lock:
            for task in self._turn:
                queue = self._queues.get(task)
                if not queue:
                    continue
                until = self._gather_until(task)
                if until <= now:
                    return 0.0
                key, limit = queue[0].key, max(1, self._limits[task].batch_items)
                queued = sum(len(job.items) - job.next for job in queue if job.key == key)
                return 0.0 if queued >= limit else until - now
        return math.inf

    def wait_s(self) -> float:
        """``due_in`` for an engine thread about to wait for work: a batch left in flight
        is read first unless another is due now, so no result waits while the thread
        does."""
        wait = self.due_in()
        if wait > 0:
            self.settle()
        return wait

    def _gather_until(self, task: str) -> float:
        """When a batch of ``task`` that is not full stops waiting for more (0: it does not
        wait): its last batch's end plus that batch's time, while jobs arrive densely."""
        end, spent = self._last_batch.get(task, (0.0, 0.0))
        arrivals = self._arrivals.get(task, ())
        dense = len(arrivals) == DENSE_ARRIVALS and arrivals[-1] - arrivals[0] <= spent
        return end + min(spent, GATHER_MAX_S) if dense else 0.0

    def delivered(self, seconds: float) -> None:
        """A caller ran again ``seconds`` after its job settled (for the trace)."""
        if self.trace.enabled:
            with self._lock:
                self._delivered.append(round(seconds * 1e3, 3))

    def close(self, message: str) -> None:
        """Refuse new jobs and fail every queued one, and those of a batch left in
        flight, with ``message`` (the engine thread is ending: nobody would run or read
        them)."""
        with self._lock:
            self.closed = message
            queued = [job for queue in self._queues.values() for job in queue]
            for queue in self._queues.values():
                queue.clear()
        inflight, self._inflight = self._inflight, None
        for job in dict.fromkeys([*queued, *(inflight[1] if inflight else ())]):
            if job.done_count >= 0:
                job.done_count = -1
                self._finish(job, None, GenerationFailed(message))

    def _finish(self, job: Job, result: list[Any] | None, error: BaseException | None) -> None:
        with self._lock:
            self._open[job.task] -= 1
        job._settle(result, error)

    def _take(self) -> tuple[list[tuple[Job, int]], Any]:
        """The next batch: (job, item index) pairs of one task and key, and its ``fn``."""
        now = time.monotonic()
        with self._lock:
            for _ in range(len(self._turn)):
                task = self._turn[0]
                self._turn.rotate(-1)
                queue = self._queues.get(task)
                expired = [j for j in queue or () if j.cancelled or (j.deadline and
                                                                    now > j.deadline)]
                for job in expired:
                    queue.remove(job)
                if not queue:
                    self._drop_expired(expired)
                    continue
                key, fn = queue[0].key, queue[0].fn
                limit = max(1, self._limits[task].batch_items)
                picked: list[tuple[Job, int]] = []
                for job in list(queue):
                    if job.key != key:
                        continue
                    while job.next < len(job.items) and len(picked) < limit:
                        picked.append((job, job.next))
                        job.next += 1
                    if job.next == len(job.items):
                        queue.remove(job)
                    if len(picked) >= limit:
                        break
                self._drop_expired(expired)
                return picked, fn
        return [], None

    def _drop_expired(self, jobs: list[Job]) -> None:
        """Outside the scan: close jobs whose caller left or whose time ran out."""
        for job in jobs:
            self._open[job.task] -= 1
            job._settle(None, RequestTimedOut(f"the {job.task} request timed out"))

    def run_due(self, decoding: bool) -> bool:
        """``run_one`` when side jobs are due: while streams decode, once their share of
        the time since the last batch allows; otherwise once a batch has gathered
        (``due_in``). True when one ran. A batch left in flight (``run_one``) is read
        first whenever no other batch is about to follow it."""
        if decoding:
            self.settle()  # a decode step never waits behind a side batch's read
        if not self.pending():
            self.settle()
            return False
        if not self.turns.due() if decoding else self.due_in() > 0:
            self.settle()
            return False
        started = time.perf_counter()
        ran = self.run_one(overlap=not decoding)
        self.turns.ran(started)
        return ran

    def run_one(self, overlap: bool = False) -> bool:
        """Run one batch, if any is queued, gathering or not; True when one ran. An
        exception from ``fn`` (or from its ``Later``'s read) fails the jobs of that batch
        only.

        A batch whose ``fn`` returns a ``Later`` (queued on the device) is read after the
        next batch has been built and queued, when ``overlap`` and that next batch is due
        at once: the device then computes one batch while the thread builds the next,
        where reading each at once would leave the device idle for every graph build.
        Otherwise it is read before this returns."""
        picked, fn = self._take()
        if not picked:
            self.settle()
            return False
        jobs = list(dict.fromkeys(job for job, _ in picked))
        task, trace = jobs[0].task, self.trace
        started = time.perf_counter()
        if trace.enabled:
            self._trace_batch(picked, jobs, started)
        try:
            later = trace.timed("side_ms", lambda: self._launch(picked, jobs, fn))
            previous, self._inflight = self._inflight, None
            if previous is not None:
                trace.timed("read_prev_ms", lambda: self._read(*previous))
            if later is not None:
                queued = time.perf_counter()  # the gathering rule reads this batch's time
                self._last_batch[task] = (queued, queued - started)
                if overlap and self.due_in() == 0:
                    self._inflight = (picked, jobs, later)
                else:
                    trace.timed("read_ms", lambda: self._read(picked, jobs, later))
        finally:
            ended = time.perf_counter()
            self._last_batch[task] = (ended, ended - started)
            trace.end()
        return True

    def settle(self) -> None:
        """Read the batch left in flight, if any, and hand its results out."""
        if self._inflight is not None:
            batch, self._inflight = self._inflight, None
            self._read(*batch)

    def _trace_batch(self, picked: list[tuple[Job, int]], jobs: list[Job],
                     started: float) -> None:
        intake = [job.submitted - job.since for job in jobs if job.since is not None]
        with self._lock:
            delivered, self._delivered = self._delivered, []
        self.trace.begin()
        self.trace.note(side=jobs[0].task, items=len(picked), jobs=len(jobs),
                        wait_ms=round((started - min(j.submitted for j in jobs)) * 1e3, 3))
        if intake:
            self.trace.note(intake_ms=round(max(intake) * 1e3, 3))
        if delivered:
            self.trace.note(deliver_ms=max(delivered), delivered=len(delivered))

    def _launch(self, picked: list[tuple[Job, int]], jobs: list[Job], fn: Any
                ) -> Later | None:
        """``fn`` over the batch: its results handed out, or its ``Later`` to read."""
        try:
            results = fn([job.items[i] for job, i in picked])
        except Exception as exc:
            self._failed(jobs, len(picked), exc)
            return None
        if isinstance(results, Later):
            return results
        self._hand_out(picked, jobs, results)
        return None

    def _read(self, picked: list[tuple[Job, int]], jobs: list[Job], later: Later) -> None:
        try:
            results = later.read()
        except Exception as exc:
            self._failed(jobs, len(picked), exc)
            return
        self._hand_out(picked, jobs, results)

    def _failed(self, jobs: list[Job], items: int, exc: Exception) -> None:
        error = exc if isinstance(exc, MlxcelError) else None
        if error is None:
            log.error("side_job_failed", task=jobs[0].task, items=items, exc_info=exc)
            error = MlxcelError(f"the {jobs[0].task} job failed: {type(exc).__name__}")
        with self._lock:  # a job with items still queued leaves the queue too
            for job in jobs:
                queue = self._queues.get(job.task)
                if queue is not None and job in queue:
                    queue.remove(job)
        for job in jobs:
            if job.done_count >= 0:  # not already failed by an earlier batch
                job.done_count = -1
                self._finish(job, None, error)

    def _hand_out(self, picked: list[tuple[Job, int]], jobs: list[Job],
                  results: list[Any]) -> None:
        if len(results) != len(picked):
            self._failed(jobs, len(picked), RuntimeError(
                f"a {jobs[0].task} batch of {len(picked)} items gave {len(results)} "
                "results"))
            return
        for (job, i), value in zip(picked, results, strict=True):
            if job.done_count >= 0:
                job.results[i] = value
                job.done_count += 1
        for job in jobs:  # a cancelled job's future is cancelled: settling it is a no-op
            if job.done_count == len(job.items):
                self._finish(job, job.results, None)


class LaneClient:
    """The asyncio side: ``call`` queues a job, wakes the engine thread, and waits for its
    results within the task's timeout."""

    def __init__(self, lane: JobLane, wake: Callable[[], None]) -> None:
        self.lane = lane
        self.wake = wake

    async def call(self, job: Job, limits: LaneLimits) -> list[Any]:
        loop = asyncio.get_running_loop()
        job._loop, job._future = loop, loop.create_future()
        job.deadline = time.monotonic() + limits.timeout_s
        self.lane.submit(job, limits)
        self.wake()
        try:
            results = await asyncio.wait_for(asyncio.shield(job._future), limits.timeout_s)
            self.lane.delivered(time.perf_counter() - job.settled)
            return results
        except asyncio.TimeoutError:
            job.cancelled = True
            job._future.cancel()
            raise RequestTimedOut(f"the {job.task} request took longer than "
                                  f"{limits.timeout_s:g} s") from None
        except asyncio.CancelledError:  # the client left: the engine skips what is left
            job.cancelled = True
            job._future.cancel()
            raise
