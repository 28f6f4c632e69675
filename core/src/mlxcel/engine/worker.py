"""The engine thread: owns every MLX array; admits, prefills and decodes sequences."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from mlxcel.engine.sequence import Sequence, Sink
from mlxcel.types import GenerationRequest

log = structlog.get_logger("mlxcel.engine")
PREFILL_CHUNK = 512


class EngineStats(msgspec.Struct, kw_only=True):
    sequences_started: int = 0
    sequences_completed: int = 0
    total_prefill_tokens: int = 0
    total_decode_tokens: int = 0
    decode_steps_processed: int = 0
    prefill_chunks_processed: int = 0


class EngineWorker(threading.Thread):
    """Round-robin decode over up to ``parallel`` sequences, one step each per loop.

    Token n+1 of every active sequence is queued (``mx.async_eval``) before token n is
    read back, so Python work overlaps the forward pass.
    """

    def __init__(self, load: Callable[[], Any], parallel: int) -> None:
        super().__init__(name="mlxcel-engine", daemon=True)
        self._load = load
        self.parallel = max(1, parallel)
        self.inbox: queue.Queue[tuple[GenerationRequest, Sink] | None] = queue.Queue()
        self.waiting: deque[Sequence] = deque()
        self.active: list[Sequence] = []
        self.stats = EngineStats()
        self.state = "loading"
        self.error: str | None = None
        self.checkpoint: Any = None
        self._stop = threading.Event()
        self.ready = threading.Event()

    # -- thread ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.checkpoint = self._load()
            self.eos_ids = set(self.checkpoint.tokenizer.eos_ids)
            self.state = "ready"
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model_load_failed", error=self.error)
            return
        finally:
            self.ready.set()
        while not self._stop.is_set():
            try:
                self._iteration()
            except Exception as exc:  # never let the engine thread die: fail the batch
                log.exception("engine_step_failed")
                for seq in [*self.active]:
                    seq.finish("error", error=f"engine error: {exc}")
                self.active = []
        for seq in [*self.active, *self.waiting]:
            seq.finish("error", error="server shutting down")

    def _iteration(self) -> None:
        self._drain(block=not (self.active or self.waiting))
        self._drop_cancelled()
        self._admit()
        if self.active:
            self._step()

    def shutdown(self) -> None:
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        """Unblock the thread (a ``None`` item carries no request)."""
        self.inbox.put_nowait(None)

    # -- scheduling -----------------------------------------------------------------------
    def _drain(self, block: bool) -> None:
        """Move submitted requests to the waiting queue (``None`` items only wake us)."""
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            while True:
                if item is not None:
                    req, sink = item
                    self.waiting.append(
                        Sequence(req, sink, self.checkpoint.tokenizer, self.eos_ids))
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _drop_cancelled(self) -> None:
        """Sequences whose consumer went away leave at once (waiting or active)."""
        if any(s.sink.cancelled for s in self.active) or \
                any(s.sink.cancelled for s in self.waiting):
            for seq in [*self.active, *self.waiting]:
                if seq.sink.cancelled:
                    seq.finish("cancelled")
            self.active = [s for s in self.active if not s.finished]
            self.waiting = deque(s for s in self.waiting if not s.finished)

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.parallel:
            seq = self.waiting.popleft()
            try:
                self._prefill(seq)
                self.active.append(seq)
                self.stats.sequences_started += 1
            except Exception as exc:
                log.exception("prefill_failed", request_id=seq.req.request_id)
                seq.finish("error", error=f"prefill failed: {exc}")

    def _prefill(self, seq: Sequence) -> None:
        """All but the last prompt token fill the cache in chunks (only the cache state is
        evaluated, so MLX never computes their logits); the last token yields the logits."""
        import mlx.core as mx

        model = self.checkpoint.model
        seq.cache = model.make_cache()
        tokens = mx.array(seq.req.prompt_tokens, dtype=mx.uint32)[None]
        n = tokens.shape[1]
        for start in range(0, n - 1, PREFILL_CHUNK):
            model(tokens[:, start : min(start + PREFILL_CHUNK, n - 1)], seq.cache)
            mx.eval([c.state for c in seq.cache])
            self.stats.prefill_chunks_processed += 1
        logits = model(tokens[:, n - 1 :], seq.cache)[:, -1, :]
        seq.pending = seq.sampler(logits)
        mx.async_eval(seq.pending)
        self.stats.prefill_chunks_processed += 1
        self.stats.total_prefill_tokens += n

    def _step(self) -> None:
        import mlx.core as mx

        model = self.checkpoint.model
        for seq in self.active:
            try:
                logits = model(seq.pending.reshape(1, 1), seq.cache)[:, -1, :]
                seq.upcoming = seq.sampler(logits)
            except Exception as exc:
                log.exception("decode_failed", request_id=seq.req.request_id)
                seq.finish("error", error=f"decode failed: {exc}")
        launched = [s.upcoming for s in self.active if not s.finished]
        if launched:
            mx.async_eval(launched)
        for seq in self.active:
            if seq.finished:
                continue
            try:
                seq.accept(int(seq.pending.item()))
            except Exception as exc:
                log.exception("sample_failed", request_id=seq.req.request_id)
                seq.finish("error", error=f"generation failed: {exc}")
            seq.pending = seq.upcoming
            self.stats.total_decode_tokens += 1
        self.stats.decode_steps_processed += 1
        done = [s for s in self.active if s.finished]
        if done:
            self.stats.sequences_completed += len(done)
            self.active = [s for s in self.active if not s.finished]
