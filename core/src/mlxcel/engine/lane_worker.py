"""LaneWorker: the engine thread of a process that serves side models only (``-m`` an
embedder, ``--embeddings``): it loads them, then runs their job lane. With a chat model the
``EngineWorker`` runs the same lane between its decode steps instead."""

from __future__ import annotations

import threading

import mlx.core as mx
import structlog

from mlxcel.engine.lanes import JobLane, LaneClient
from mlxcel.engine.parts import BufferRelease
from mlxcel.engine.side import SideEngine, load_sides
from mlxcel.engine.trace import Trace

log = structlog.get_logger("mlxcel.engine")


class LaneWorker(threading.Thread):
    """Owns every MLX array of its side models. ``state``: loading, ready, failed or
    stopped, as the ``EngineWorker``'s; ``ready`` is set once loading ended either way.
    ``trace``: the ``--engine-trace`` file, which gets the lane's line per batch."""

    def __init__(self, sides: list[SideEngine], lane: JobLane | None = None,
                 trace: str | None = None) -> None:
        super().__init__(name="mlxcel-side-engine", daemon=True)
        self.sides = sides
        self.lane = lane or JobLane()
        self.state = "loading"
        self.error: str | None = None
        self.ready = threading.Event()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self.buffers = BufferRelease()
        self.trace_path = trace

    def client(self) -> LaneClient:
        return LaneClient(self.lane, self.wake)

    def wake(self) -> None:
        self._wakeup.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.wake()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def step(self, block: bool = True) -> bool:
        """Run one batch of queued jobs once one is due (``JobLane.due_in``: at once, or
        when a batch that is not full has gathered), waiting for that (up to the
        idle-release time) when ``block``; True when a batch ran. A job's submit wakes the
        wait, so a batch that fills runs at once. Batches that follow each other overlap
        (``JobLane.run_one``); a batch in flight is read before any wait."""
        if block:
            wait = self.lane.wait_s()
            if wait > 0:
                self._wakeup.wait(min(wait, self.buffers.idle_s))
        self._wakeup.clear()
        return self.lane.run_due(decoding=False)

    def run(self) -> None:
        try:
            load_sides(self.sides)
            self.lane.trace = Trace.to(self.trace_path)
            self.state = "ready"
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model_load_failed", error=self.error)
        finally:
            self.ready.set()
        if self.state != "ready":
            self.lane.close(f"engine stopped: {self.error}")
            return
        try:
            while not self._stopping.is_set():
                if self.step():
                    self.buffers.dirty = True
                if self.buffers.due(self.lane.pending()):
                    mx.clear_cache()
        except BaseException as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.critical("engine_thread_died", error=self.error, exc_info=True)
        else:
            self.state = "stopped"
        self.lane.trace.flush()
        self.lane.close("server shutting down" if self.state == "stopped"
                        else f"engine stopped: {self.error}")
