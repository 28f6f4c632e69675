"""Parts of the engine worker that own their state: its counters (``EngineStats``), how its
events reach consumers (``Deliveries``), the inbox of submitted requests, the release of
MLX's buffer cache when the engine goes idle, and the warm-up left for after startup.
(The job lane is ``mlxcel.engine.lanes``'s; the scheduling state is the worker's own.)"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from mlxcel.errors import GenerationFailed

log = structlog.get_logger("mlxcel.engine")

IDLE_RELEASE_S = 2.0  # idle this long after work: MLX's buffer cache goes back
PREFILL_HELD_BYTES = 1 << 30  # more than this held after a prefill chunk: it goes back
WARM_SHARE = 0.1  # of the engine thread's time the warm-up takes while requests run
WARM_IDLE_S = 0.05  # idle this long before warm-up items run back to back


class Deliveries(contextlib.nullcontext):
    """How a step's events reach their consumers: as emitted (this, with no client); an
    ``EngineClient`` installs ``client.HeldWakeups`` (one loop wake-up per block or flush)."""

    def flush(self) -> None: ...


class EngineStats(msgspec.Struct, kw_only=True):
    """The engine's cumulative counters (``/health``'s observability, ``/metrics``)."""

    sequences_started: int = 0
    sequences_completed: int = 0
    total_prefill_tokens: int = 0
    total_decode_tokens: int = 0
    decode_steps_processed: int = 0
    prefill_chunks_processed: int = 0
    # speculative decoding: rows' verify rounds, tokens drafted, of them accepted
    draft_rounds: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0


class Inbox:
    """Requests handed to the engine thread. ``queued`` counts those submitted and not yet
    admitted to a slot (the admission limit reads it); once ``closed``, the thread has
    ended and submits are refused, so no request waits for a thread that is gone."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.queued = 0
        self.closed = False
        self.lock = threading.Lock()

    def put(self, item: Any, error: Callable[[], str]) -> None:
        """Queue ``item``; GenerationFailed (with ``error()``) once closed."""
        with self.lock:
            if self.closed:
                raise GenerationFailed(error())
            self.queued += 1
            self.items.put(item)

    def count(self, delta: int) -> None:
        with self.lock:
            self.queued += delta

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def wake(self) -> None:
        """Unblock the thread (a ``None`` item carries no request)."""
        self.items.put_nowait(None)


class BufferRelease:
    """When to free MLX's buffer cache: once the engine has been idle for ``idle_s``
    seconds after work; at once when asked (a prompt-cache reset, a step that failed,
    perhaps for want of memory); and after a prefill chunk that left more than
    ``held_bytes`` cached. Buffers a burst or a long prompt left behind go back to the
    system instead of staying held by an idle server, while back-to-back requests keep
    reusing them instead of allocating anew.

    The prefill bound is mlx-lm's rule (its prefill loops clear the cache after every
    chunk) kept for the chunks that need it: each chunk of a long prompt leaves buffers of
    sizes no later chunk asks for (attention scores over a context one chunk longer, a KV
    cache grown past its last size), so a held cache only grows. On CUDA the device then
    runs out while MLX still holds them, and a step fails instead of allocating."""

    def __init__(self, idle_s: float = IDLE_RELEASE_S,
                 held_bytes: float = PREFILL_HELD_BYTES) -> None:
        self.idle_s = idle_s
        self.held_bytes = held_bytes
        self.dirty = False  # work ran since the cache was last cleared
        self.requested = False  # set from other threads (a prompt-cache reset)
        self.prefilled = False  # a prefill chunk ran since the last ``due``
        self._idle_since: float | None = None

    def due(self, busy: bool, cached: Callable[[], int] | None = None) -> bool:
        """Whether to clear now (then the state starts over); ``busy``: work is held;
        ``cached``: the bytes MLX's buffer cache holds now (``mx.get_cache_memory``)."""
        if busy:
            self._idle_since = None
        elif self.dirty and self._idle_since is None:
            self._idle_since = time.monotonic()
        idle_long = self._idle_since is not None \
            and time.monotonic() - self._idle_since >= self.idle_s
        over = self.prefilled and cached is not None and cached() > self.held_bytes
        self.prefilled = False
        if self.requested or over or (self.dirty and idle_long):
            self.requested = self.dirty = False
            self._idle_since = None
            return True
        return False


class TimeShare:
    """At most ``share`` of the engine thread's time for work beside serving (side jobs, the
    warm-up): after a run that took t seconds, the next one while requests run waits
    t * (1 - share) / share; while nothing is served, runs are not held (``due`` is asked
    only while requests run). Work that runs while streams decode then stretches them by
    a bounded factor, and runs back to back once nothing is served. The wait follows a
    run made while idle too: streams that start right after one get their steps first,
    rather than a second run at once, which would stall their first tokens' gaps by a
    whole run."""

    def __init__(self, share: float) -> None:
        self.share = share
        self._next = 0.0  # no run before this while requests run (perf_counter)

    def due(self) -> bool:
        return time.perf_counter() >= self._next

    def ran(self, started: float) -> float:
        """A run that began at ``started`` (``perf_counter``) just ended; its seconds."""
        spent = time.perf_counter() - started
        self._next = started + spent / self.share
        return spent


class Warming:
    """Warm-up items left for after startup (``accel.warmup.WarmPlan.later``), run on the
    engine thread between steps, one per step: within their ``TimeShare`` while requests
    run, back to back once the engine has been idle for ``idle_s``. An item that fails
    drops the rest: the warm-up is only a speed-up.

    The idle wait is for clients that send their next request as soon as the last one
    ended (an agent's turns, a sequential benchmark): the engine is idle between them for
    a round trip, and an item started then is what the next request would wait out."""

    def __init__(self, items: list[tuple[str, Callable[[], Any]]] | None = None,
                 share: float = WARM_SHARE, idle_s: float = WARM_IDLE_S) -> None:
        self.items = deque(items or ())
        self.turns = TimeShare(share)
        self.idle_s = idle_s
        self.spent = 0.0  # seconds the items took so far
        self._idle_since: float | None = None

    def __bool__(self) -> bool:
        return bool(self.items)

    def idle_wait(self) -> float:
        """Seconds until an idle engine's next item is due: 0 for now, ``math.inf`` with
        none left."""
        if not self.items:
            return math.inf
        if self._idle_since is None:
            return self.idle_s
        return max(0.0, self._idle_since + self.idle_s - time.perf_counter())

    def run_due(self, busy: bool) -> bool:
        """Run the next item if one is due (see the class docstring); True when one ran."""
        if not self.items:
            return False
        if busy:
            self._idle_since = None
            if not self.turns.due():
                return False
        else:
            if self._idle_since is None:
                self._idle_since = time.perf_counter()
            if self.idle_wait() > 0:
                return False
        started = time.perf_counter()
        _, work = self.items.popleft()
        try:
            work()
        except Exception as exc:
            log.warning("engine_warmup_failed", error=f"{type(exc).__name__}: {exc}",
                        left=len(self.items))
            self.items.clear()
            return True
        self.spent += self.turns.ran(started)
        if not self.items:
            log.info("engine_warmup_done", seconds=round(self.spent, 2))
        return True
