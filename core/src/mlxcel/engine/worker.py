"""The engine thread: owns every MLX array; schedules prefill and batched decode."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import structlog

from mlxcel.engine import distributed, mixed_batch
from mlxcel.engine.admission import Admission
from mlxcel.engine.batch import DecodeBatch, PrefillJob
from mlxcel.engine.cache.prompt_cache import BLOCK_SIZE, PromptCache
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.heads import Heads
from mlxcel.engine.lanes import JobLane
from mlxcel.engine.media_rows import FeatureCache
from mlxcel.engine.parts import BufferRelease, Deliveries, EngineStats, Inbox, Warming
from mlxcel.engine.policy import EnginePolicy
from mlxcel.engine.scheduler import Plan
from mlxcel.engine.sequence import Sequence, Sink, end_all
from mlxcel.engine.setup import EngineSetup
from mlxcel.engine.side import SideEngine
from mlxcel.engine.speculative import Speculation
from mlxcel.engine.steps import read_back
from mlxcel.engine.trace import NullTrace
from mlxcel.engine.verify import verify_step
from mlxcel.types import GenerationRequest

log = structlog.get_logger("mlxcel.engine")
PERSIST_S = 8.0  # at shutdown, what the prompt cache may take to write its disk tier



class EngineWorker(EngineSetup, Admission, threading.Thread):
    """Continuous batching: each loop (``step``) runs at most one prefill chunk, one decode
    step and one batch of side jobs (``lane``: embeddings, rerank, ...).

    Waiting requests are admitted by priority lane (then arrival) while slots are free;
    rows that finish or whose client left are dropped before the next step. Step n+1 is
    built before step n's tokens are read back, so the device computes step n while
    Python builds step n+1 (see ``_decode_step``).
    """

    def __init__(self, load: Callable[[], Any], parallel: int, prefill_chunk: int = 512,
                 prompt_cache: PromptCache | None = None,
                 config: EngineConfig | None = None,
                 policy: EnginePolicy | None = None,
                 sides: list[SideEngine] | None = None,
                 lane: JobLane | None = None) -> None:
        """``policy``: the device choices; None resolves them from this process's device
        and ``config`` at setup (``mlxcel.engine.policy``). ``sides``: side models this
        thread loads at setup and whose jobs (on ``lane``) it runs between steps."""
        super().__init__(name="mlxcel-engine", daemon=True)
        self.config = config or EngineConfig()
        self.policy = policy
        self.prompt_cache = prompt_cache or PromptCache(0, enabled=False)
        self._load = load
        self.parallel = max(1, parallel)
        self.prefill_chunk = max(1, prefill_chunk)
        self.requests = Inbox()  # submitted requests (their count, closing)
        self.waiting: list[Sequence] = []  # heap
        self.prefilling: PrefillJob | None = None
        self.prefilled: list[PrefillJob] = []  # prefilled, waiting to join together
        self.batch: DecodeBatch | None = None
        self.spec: Speculation | None = None  # the drafter, where rows may draft (setup)
        self.inflight: tuple[list[Sequence], Any] | None = None
        self.stats = EngineStats()
        self.state = "loading"
        self.error: str | None = None
        self.checkpoint: Any = None
        self.rope: Any = None  # shared-position RoPE (mlxcel.engine.cache.kvcache)
        self.path = "shared"  # which caches rows decode on (_choose_path)
        self.batchable = self.grouped = True
        self.media_grouped = False  # media rows prefill together (_choose_path)
        self.merge: Any = None  # mixed path: rows' caches -> batch caches
        self.forward: Any = None  # a decode step's forward (setup: lean_decode.forward_for)
        self.heads = Heads(None)  # the prefill's output projection, narrowed (setup)
        self.align = 1  # prefill column multiple: the policy's where rows may be padded
        self.budget = self.prefill_chunk  # tokens per step of the group prefilling now
        self.checkpoint_interval = BLOCK_SIZE * max(0, self.config.cache_checkpoint_interval)
        self.features = FeatureCache(self.config.vision_cache_size)
        self._order = itertools.count()
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self.trace: NullTrace = NullTrace()  # --engine-trace (mlxcel.engine.trace)
        self.deliveries = Deliveries()  # one wake-up per iteration (EngineClient's)
        self.buffers = BufferRelease()  # when MLX's buffer cache goes back
        self.warming = Warming()  # warm-up left for between steps (setup)
        self.prompt_cache.on_reset = self.request_clear
        self.dist: Any = distributed.Alone()  # the other ranks' hooks (--distributed)
        self.sides = list(sides or [])
        self.lane = lane or JobLane()

    # -- views for the event loop --------------------------------------------------------
    @property
    def active(self) -> list[Sequence]:
        rows = [s for s in self.batch.rows if not s.finished] if self.batch else []
        jobs = [*self.prefilled, *([self.prefilling] if self.prefilling else [])]
        return rows + [s for job in jobs for s in job.seqs if not s.finished]

    def held(self) -> list[Sequence]:
        """Every sequence the engine holds, finished ones whose event may be held included."""
        rows = list(self.batch.rows) if self.batch else []
        rows += self.inflight.rows if self.inflight is not None else []
        jobs = [*self.prefilled, *([self.prefilling] if self.prefilling else [])]
        return rows + [s for job in jobs for s in job.seqs] + list(self.waiting)

    # -- thread ---------------------------------------------------------------------------
    @property
    def burst_chunks(self) -> int:
        """The policy's burst chunks where rows prefill in groups, else 1; ``-b`` (the
        config's ``batch_size``) caps a step's prefill tokens, so it caps the chunks too."""
        chunks = self.policy.burst_chunks if self.grouped else 1
        if self.config.batch_size:
            chunks = min(chunks, max(1, self.config.batch_size // self.prefill_chunk))
        return chunks

    def _new_batch(self) -> DecodeBatch:
        batch = DecodeBatch(self.checkpoint.model, self.checkpoint.tokenizer.vocab_size,
                            lazy_leave=self.policy.lazy_leave,
                            ops=mixed_batch.MixedOps if self.path == "mixed" else None,
                            forward=self.forward)
        batch.share = self.dist.share_tokens
        return batch

    def run(self) -> None:
        """Serve until shutdown. However the loop ends, every open request gets a finish
        event and later submits are refused (``close``): a dead engine thread must never
        leave a client waiting. ``state`` ends "stopped" on a requested shutdown, otherwise
        "failed" with ``error`` set."""
        if not self.setup():
            return
        if self.policy.switch_interval is not None:
            sys.setswitchinterval(self.policy.switch_interval)
        try:
            self._serve()
            self.prompt_cache.persist(PERSIST_S)
            self.dist.stop()
        except BaseException as exc:  # the thread is ending: tell every client, then end
            self.error = f"{type(exc).__name__}: {exc}"
            log.critical("engine_thread_died", error=self.error, exc_info=True)
        finally:
            self.close()
        self.trace.flush()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                with self.deliveries:
                    self.step()
            except Exception as exc:  # not attributable to a row: fail the running batch
                if (fatal := self.dist.fatal(exc)) is not None:  # ranks out of step
                    raise RuntimeError(fatal) from exc
                log.exception("engine_step_failed")
                self._fail_running(f"engine error: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Refuse new submits, then end every held and queued request with an error."""
        self.requests.close()
        with self.requests.lock:
            if self._stopping.is_set() and self.error is None:
                self.state, message = "stopped", "server shutting down"
            else:
                self.error = self.error or "the engine thread ended"
                self.state, message = "failed", f"engine stopped: {self.error}"
        held = self.held()
        self.waiting, self.prefilling, self.prefilled, self.inflight = [], None, [], None
        end_all(held, self.inbox, message)
        self.lane.close(message)

    # -- the parts' views (tests and the client read these) ------------------------------
    @property
    def inbox(self) -> Any:
        return self.requests.items

    @property
    def queued(self) -> int:
        return self.requests.queued

    @property
    def closed(self) -> bool:
        return self.requests.closed

    def enqueue(self, req: GenerationRequest, sink: Sink) -> None:
        """Queue a request for the engine thread; GenerationFailed once it has ended."""
        self.requests.put((req, sink),
                          lambda: f"engine stopped: {self.error or 'shut down'}")

    def request_clear(self) -> None:
        """Ask the engine thread to free MLX's buffer cache (from any thread)."""
        self.buffers.requested = True
        self.wake()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop after the current step; running requests end with an error event."""
        self._stopping.set()
        self.wake()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def count_queued(self, delta: int) -> None:
        self.requests.count(delta)

    def wake(self) -> None:
        """Unblock the thread (a ``None`` item carries no request)."""
        self.requests.wake()

    def step(self) -> None:
        """One loop of the engine thread: take what arrived (waiting for it when idle),
        plan, execute, then at most one batch of side jobs and one warm-up item, each within
        its share of the time while requests run (``JobLane.run_due``, ``Warming``). With
        nothing else to do, a side batch that is still gathering (``JobLane.wait_s``) and
        the warm-up's idle wait (``Warming.idle_wait``) are waited for here, as a side-only
        ``LaneWorker`` does: a submit or a request wakes the wait."""
        busy = bool(self.batch or self.prefilling or self.prefilled or self.waiting)
        wait = 0.0 if busy else min(self.lane.wait_s(), self.warming.idle_wait())
        arrived = self._drain(block=wait > 0, timeout=min(wait, 0.5))
        self.trace.begin()
        self.trace.note(arrived=arrived, waiting=len(self.waiting))
        self.execute(self._plan())
        ran = self.lane.run_due(decoding=bool(self.batch or self.prefilling or self.prefilled))
        ran = self.warming.run_due(self._busy()) or ran
        if ran:
            self.buffers.dirty = True
            if self.spec is not None:  # not a decode step's cost
                self.spec.batch.interrupted()

    def execute(self, plan: Plan) -> None:
        """Carry out one plan (``mlxcel.engine.scheduler``): cancellations, leaving rows,
        a prefill step (admission, held or joining groups), then a decode step."""
        self._cancel(plan)
        if plan.leave:
            self.dist.dropped()
            self.batch.drop_finished()
        self._prefill_step(plan)
        if self.batch:
            self._decode_step()
        elif self.inflight is not None:
            self._settle(self._read_back())
        self._release_memory()
        self.dist.end_iteration(self._busy())
        self.trace.end()

    def _busy(self) -> bool:
        return bool(self.batch or self.prefilling or self.prefilled or self.waiting
                    or self.inflight is not None)

    def _release_memory(self) -> None:
        """Free MLX's buffer cache when ``buffers`` says so (``BufferRelease``); only this
        thread calls MLX."""
        if self.buffers.due(self._busy(), mx.get_cache_memory):
            self.dist.cleared()
            mx.clear_cache()

    def _fail_running(self, message: str) -> None:
        """Fail every running row (waiting requests stay queued) and start from an empty
        batch, so the engine keeps serving."""
        waiting = set(map(id, self.waiting))
        end_all([s for s in self.held() if id(s) not in waiting], None, message)
        self.prefilling, self.inflight, self.prefilled = None, None, []
        self.batch = self._new_batch()
        self.buffers.requested = True  # the failure may have been for want of memory

    def _remember(self, keep: list[Sequence]) -> None:
        """Keep finished sequences' KV (prompt + output) for later prompts that share it."""
        self.trace.note(stored=len(keep))
        self.trace.timed("store_ms", lambda: self._store(keep))

    def _store(self, keep: list[Sequence]) -> None:
        try:
            for seq, (tokens, stored) in zip(keep, self.batch.snapshots(keep), strict=True):
                self.prompt_cache.insert(tokens, stored, seq.checkpoints,
                                         dict(seq.req.media_digests), seq.cache_hit or None,
                                         len(seq.req.prompt_tokens), seq.prompt_hashes)
                seq.checkpoints = []
        except Exception:
            log.exception("prompt_cache_insert_failed",
                          request_ids=[s.req.request_id for s in keep])
        self.dist.stored(keep)

    def _decode_step(self) -> None:
        """Build step n+1, then queue it and hand out step n's tokens.

        The order of the last two depends on the backend (``EnginePolicy.emit_first``). On CUDA,
        queuing a step (``mx.async_eval``) encodes its kernels on this thread with the GIL
        released, for several ms: step n's tokens go out (``deliveries.flush``: one wake-up
        of the HTTP side for all of them) just before it, so the HTTP side writes them
        during the encoding rather than while this thread builds the next graph in Python.
        Elsewhere queuing is quick and the device computes the step, so it is queued first
        and nothing waits on Python.
        """
        if self.spec is not None and self._speculate():
            return
        if self.batch.needs_sync:  # penalties need the previous token before the next step
            self._settle(self._read_back())
            self.dist.dropped()
            self.batch.drop_finished()
            if not self.batch:
                return
        self.dist.launch()  # the other ranks build the same step
        step = self.trace.timed("build_ms", self.batch.launch)
        self.stats.decode_steps_processed += 1
        self.buffers.dirty = True
        self.trace.note(decode_rows=len(step.rows))
        done: list[Sequence] = []
        try:
            if self.policy.emit_first:
                done = self.trace.timed("read_back_ms", self._read_back)
                self.deliveries.flush()  # the consumers run while this thread encodes
                self.trace.timed("queue_ms", step.start)
            else:
                self.trace.timed("queue_ms", step.start)
                done = self.trace.timed("read_back_ms", self._read_back)
        finally:
            # after step n+1 is queued (its arrays are what the store copies from), and
            # even if queuing failed: held finish events must go out
            self._settle(done)
        self.inflight = step
        if self.spec is not None:
            self.spec.plain(step.rows)

    def _speculate(self) -> bool:
        """A verify step (``mlxcel.engine.verify``) when some row drafts: the previous
        step's tokens are read back first, since the drafts continue them. False when no
        row drafts this step: the caller builds a one-token step."""
        if not self.spec.wants(self.batch.rows):
            return False
        self._settle(self._read_back())
        self.dist.dropped()
        self.batch.drop_finished()
        if not self.batch:
            return True
        drafts = self.trace.timed("propose_ms",
                                  lambda: self.spec.propose(self.batch.rows, self.batch.cache))
        if drafts is None:
            return False
        done = self.trace.timed("verify_ms", lambda: verify_step(
            self.batch, drafts, self.spec, self.stats, self.trace, self.policy.verify_stages))
        self.stats.decode_steps_processed += 1
        self.buffers.dirty = True
        self._settle(done)
        return True

    def _read_back(self) -> list[Sequence]:
        """Hand the previous step's tokens to their sequences (``steps.read_back``)."""
        if self.inflight is None:
            return []
        step, self.inflight = self.inflight, None
        self.dist.read_back()
        return read_back(step, self.stats)

    def _settle(self, done: list[Sequence]) -> None:
        """Send finished sequences' finish events, then store them in the prompt cache.

        The store copies every finished row's KV (tens of ms when dozens of rows finish
        together), so the finish events do not wait for it. A client still sees its request
        fully accounted for when it acts on the finish event: the counters moved before it,
        its next turn is admitted by this thread after the store, and /v1/cache/stats and
        /v1/cache/reset wait for the store the engine announced (``begin_inserts``).
        """
        keep = [s for s in done if self.prompt_cache.enabled and s.req.cache_prompt
                and s in self.batch.rows]
        if keep:
            self.prompt_cache.begin_inserts()
        try:
            for seq in done:
                seq.release_finish()
            self.deliveries.flush()  # finish events go out before the store
        finally:
            if keep:
                try:
                    self._remember(keep)
                finally:
                    self.prompt_cache.end_inserts()

