"""EngineClient: the asyncio side of the engine. ``submit()`` -> async iterator of events."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from mlxcel.engine.cache.prompt_cache import PromptCache
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.lanes import Job, LaneClient, LaneLimits
from mlxcel.engine.memory import estimate_request_bytes
from mlxcel.engine.served import ServedTotals
from mlxcel.engine.worker import EngineWorker
from mlxcel.errors import (
    ContextLengthExceeded,
    GenerationFailed,
    InvalidRequest,
    MemoryBudgetExceeded,
    ModelLoading,
    Overloaded,
)
from mlxcel.types import GenerationEvent, GenerationRequest

# A slow reader never stalls the engine: past this many unread events, text is merged
# into the last one, so a stream holds a bounded number of events.
MAX_BUFFERED_EVENTS = 64
# finishes that count in ``served`` only once a token came: before it, the prompt may never
# have been computed (a request cancelled while it waited)
UNSERVED = frozenset({"cancelled", "error"})


_held = threading.local()  # per thread: mailbox -> posts whose wake-up waits (HeldWakeups)


class Mailbox:
    """Hands engine-thread events to one asyncio loop, waking it once per burst.

    ``call_soon_threadsafe`` per event writes to the loop's self-pipe every time (a batch
    of 64 rows = 64 wake-ups per step); posts made while a drain is already scheduled ride
    along with it, and posts made while the posting thread holds its wake-ups
    (``HeldWakeups``) wait for its ``flush``, so a decode step wakes each loop once.
    """

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = \
        weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # the registry's key: no strong reference to it
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[[Any], None], Any, Callable[[], None] | None]] = []
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Mailbox:
        with cls._registry_lock:
            box = cls._by_loop.get(loop)
            if box is None:
                box = cls._by_loop[loop] = cls(loop)
            return box

    def post(self, fn: Callable[[Any], None], arg: Any,
             lost: Callable[[], None] | None = None) -> None:
        """Run ``fn(arg)`` on the loop soon; raises RuntimeError if the loop is closed.
        While this thread holds its wake-ups the post waits for the flush, and ``lost``
        is called if the loop turns out to be gone then."""
        held = getattr(_held, "posts", None)
        if held is not None:
            items = held.get(self)
            if items is None:
                items = held[self] = []
            items.append((fn, arg, lost))
            return
        self._put([(fn, arg, lost)])

    def _put(self, items: list[tuple[Callable[[Any], None], Any,
                                     Callable[[], None] | None]]) -> None:
        with self._lock:
            self._items.extend(items)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop = self._loop()
            if loop is None:
                raise RuntimeError("event loop is gone")
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                items, self._items, self._scheduled = self._items, [], False
            for _, _, lost in items:
                if lost is not None:
                    lost()
            raise

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for fn, arg, _ in items:
            fn(arg)


class HeldWakeups:
    """The engine thread's per-step delivery: inside ``with held:`` its posts queue without
    taking a lock or waking their loops, and ``flush()`` (and the end of the block) hands
    them over, each loop woken once. A step of 64 rows then costs one self-pipe write and
    one loop wake-up, not one per event that found no drain scheduled."""

    def __enter__(self) -> HeldWakeups:
        if getattr(_held, "posts", None) is None:
            _held.posts = {}
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        finally:
            _held.posts = None

    def flush(self) -> None:
        posts = getattr(_held, "posts", None)
        if not posts:
            return
        _held.posts = {}
        for box, items in posts.items():
            with contextlib.suppress(RuntimeError):  # ``lost`` told their streams
                box._put(items)


def merged(first: GenerationEvent, then: GenerationEvent) -> GenerationEvent:
    """Two unfinished events as one (a slow consumer's backlog), nothing of either lost."""
    shift = len(first.text)
    return GenerationEvent(text=first.text + then.text,
                           token_ids=first.token_ids + then.token_ids,
                           logprobs=first.logprobs + then.logprobs,
                           specials=first.specials + tuple((a + shift, b + shift)
                                                           for a, b in then.specials))


class EventStream:
    """Events of one request. Closing it early (client gone) cancels the generation."""

    def __init__(self, client: EngineClient, req: GenerationRequest,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self.request = req
        self._loop = loop
        self._mailbox = Mailbox.of(loop)
        self._buffer: deque[GenerationEvent] = deque()
        # the reader's future while it waits: one bare future per wait, set by ``_push``
        # (an asyncio.Event adds a coroutine and a waiter list per event)
        self._waiter: asyncio.Future[None] | None = None
        self.done = False
        self.cancelled = False  # read by the engine thread between steps
        self._submitted = time.perf_counter()
        self.prefill_at: float | None = None  # when the engine began computing the prompt
        self._first: float | None = None  # when the first token (or the finish) came

    def emit(self, event: GenerationEvent) -> None:
        """Called from the engine thread; never raises into it. The first token's and the
        finish's times are taken here, as the engine hands them out (``served``)."""
        if self._first is None and (event.token_ids or event.finish_reason is not None):
            self._first = time.perf_counter()
        if event.finish_reason is not None:
            self._count(event)
        try:
            self._mailbox.post(self._push, event, self._lost)
        except RuntimeError:  # the consumer's event loop is gone: stop generating for it
            self.cancelled = True

    def prefill_started(self, at: float) -> None:
        """Called from the engine thread when its prefill group starts (``Sink``)."""
        self.prefill_at = at

    def _count(self, finish: GenerationEvent) -> None:
        """Add the finished request to the engine's ``served`` totals: the prompt's
        seconds run from its prefill's start (llama-server's ``t_start_process_prompt``),
        never from its submission, so the time it waited for a slot is not counted."""
        usage = finish.usage
        if usage is None or (not usage.completion_tokens and finish.finish_reason in UNSERVED):
            return
        start = self.prefill_at if self.prefill_at is not None else self._submitted
        self._client.served.request(usage.prompt_tokens, usage.cached_tokens,
                                    usage.completion_tokens, start,
                                    self._first or start, time.perf_counter())

    def _lost(self) -> None:
        self.cancelled = True

    def _push(self, event: GenerationEvent) -> None:
        buf = self._buffer
        if len(buf) >= MAX_BUFFERED_EVENTS and buf[-1].finish_reason is None \
                and event.finish_reason is None:
            buf[-1] = merged(buf[-1], event)
        else:
            buf.append(event)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self.done:
            raise StopAsyncIteration
        while not self._buffer:
            self._waiter = self._loop.create_future()
            await self._waiter
        event = self._buffer.popleft()
        if event.finish_reason is not None:
            self.done = True
        return event

    def take_ready(self) -> list[GenerationEvent]:
        """Events already delivered and not yet read (never waits); ends the stream when
        they include the finish event."""
        out: list[GenerationEvent] = []
        while self._buffer and not self.done:
            event = self._buffer.popleft()
            out.append(event)
            if event.finish_reason is not None:
                self.done = True
        return out

    async def aclose(self) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop the generation (no-op once the finish event was read)."""
        if not self.done:
            self.done = self.cancelled = True
            self._client.worker.wake()


class EngineClient:
    """Owns the engine thread; the only way dialects reach the model."""

    def __init__(self, load: Callable[[], Any], parallel: int, ctx_size: int = 0,
                 prefill_chunk: int = 512, max_queue_depth: int = 32,
                 prompt_cache: PromptCache | None = None,
                 config: EngineConfig | None = None, policy: Any = None) -> None:
        """``config``: the engine's settings (``EngineConfig.from_settings``); None = the
        engine's defaults, as with nothing configured. ``policy``: an ``EnginePolicy``
        instead of this device's (tests)."""
        self.worker = EngineWorker(load, parallel, prefill_chunk, prompt_cache, config,
                                   policy)
        self.worker.deliveries = HeldWakeups()  # one loop wake-up per engine step
        self.prompt_cache = self.worker.prompt_cache
        self.requested_ctx = ctx_size
        self.max_queue_depth = max_queue_depth
        self.lanes = LaneClient(self.worker.lane, self.worker.wake)
        self.served = ServedTotals()  # finished requests' prompt/generation totals

    async def call(self, job: Job, limits: LaneLimits) -> list[Any]:
        """Run one-shot work on the engine thread between decode steps (the job lane):
        ``job.fn`` over ``job.items``, batched with other jobs of its task and key."""
        return await self.lanes.call(job, limits)

    def start(self) -> None:
        self.worker.start()

    def shutdown(self) -> None:
        self.worker.shutdown()

    @property
    def state(self) -> str:
        return self.worker.state

    @property
    def cache_marks(self) -> bool:
        """Whether requests should carry their prompts' message boundaries
        (``GenerationRequest.cache_marks``): the engine keeps checkpoints at them where
        its model's caches cannot be cut back to any prefix."""
        cache = self.prompt_cache
        return cache.enabled and cache.reuse.mode != "prefix" and not self.worker.dist.active

    @property
    def checkpoint(self) -> Any:
        if self.worker.state == "loading":
            raise ModelLoading("Loading model")
        if self.worker.state == "failed" and self.worker.checkpoint is None:
            raise GenerationFailed(f"model failed to load: {self.worker.error}")
        if self.worker.state in ("failed", "stopped"):
            raise GenerationFailed(f"engine stopped: {self.worker.error or 'shut down'}")
        return self.worker.checkpoint

    @property
    def context_size(self) -> int:
        """Per-slot context window: explicit --ctx-size split over slots, else the model's."""
        if self.requested_ctx > 0:
            return max(1, self.requested_ctx // self.worker.parallel)
        return self.checkpoint.context_length

    def fit(self, prompt_len: int, max_tokens: int | None) -> int:
        """Check the prompt fits; return ``max_tokens`` clamped to what is left."""
        ctx = self.context_size
        if prompt_len >= ctx:
            raise ContextLengthExceeded(
                f"the prompt has {prompt_len} tokens, more than the context window of {ctx} "
                "tokens allows (leave room for at least one generated token)", param="messages",
                n_prompt_tokens=prompt_len, n_ctx=ctx)
        room = ctx - prompt_len
        return room if max_tokens is None else min(max_tokens, room)

    def submit_choices(self, reqs: list[GenerationRequest]) -> list[EventStream]:
        """The n choices of one prompt, admitted together or refused at once; the engine
        prefills their prompt once (``mlxcel.engine.fork``)."""
        from mlxcel.engine.fork import submit_choices

        return submit_choices(self, reqs)

    def submit(self, req: GenerationRequest) -> EventStream:
        """Admit a request or refuse it at once (before any response byte is sent)."""
        _ = self.checkpoint  # raises while loading / after a failed load
        if not req.prompt_tokens:
            raise InvalidRequest("the prompt is empty", param="prompt")
        if not self.admits_one_more():
            raise Overloaded("All slots are busy. Please try again later.")
        estimated = self.estimate_bytes(req)
        if estimated > self.worker.memory_budget:
            raise MemoryBudgetExceeded(estimated, self.worker.memory_budget)
        stream = EventStream(self, req, asyncio.get_running_loop())
        self.worker.enqueue(req, stream)  # GenerationFailed once the engine thread ended
        return stream

    def admits_one_more(self) -> bool:
        """The queue takes one more while fewer than ``max_queue_depth`` wait, or while a
        free slot has nobody waiting for it. Counting waiters, not busy slots, keeps the
        bound under churn: a slot between two sequences must not open the queue."""
        free = self.parallel - self.active_count
        return self.queue_depth < max(self.max_queue_depth, free)

    def estimate_bytes(self, req: GenerationRequest) -> int:
        worker = self.worker
        return estimate_request_bytes(self.checkpoint.config, len(req.prompt_tokens),
                                      req.max_tokens, worker.prefill_chunk, worker.dtype_bytes)

    # -- observability (read from the event loop; plain reads of engine-thread state) ----
    @property
    def parallel(self) -> int:
        return self.worker.parallel

    @property
    def active_count(self) -> int:
        """Sequences holding a slot (decoding or prefilling)."""
        return len(self.worker.active)

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot (submitted, not yet admitted)."""
        return self.worker.queued

    def slot_states(self) -> list[str]:
        """One entry per slot: "decoding" or "idle"."""
        busy = min(self.active_count, self.parallel)
        return ["decoding"] * busy + ["idle"] * (self.parallel - busy)

    @property
    def drafts_accepted(self) -> int:
        """Draft tokens the target model kept, over every verify step (0 without a
        drafter): a verify step hands each row these beyond its one token."""
        spec = self.worker.spec
        return 0 if spec is None else int(spec.accepted)

    @property
    def speculative(self) -> bool:
        """Whether a drafter may draft for the slots' rows (``/slots``' ``speculative``)."""
        return self.worker.spec is not None

    @property
    def speculation(self) -> Any:
        """The engine's ``Speculation`` (None without a drafter): its governors' state for
        ``/slots`` and ``/metrics`` (plain reads)."""
        return self.worker.spec

    def slot_rows(self) -> list[Any]:
        """The sequences holding slots (``Sequence``: its request, tokens generated and
        from the prompt cache), in the order ``slot_states`` counts them busy."""
        return self.worker.active[: self.parallel]

    @property
    def stats(self) -> Any:
        """Cumulative counters (EngineStats)."""
        return self.worker.stats
