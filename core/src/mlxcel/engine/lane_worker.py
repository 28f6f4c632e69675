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

log = structlog.get_logger("mlxcel.engine")


class LaneWorker(threading.Thread):
    """Owns every MLX array of its side models. ``state``: loading, ready, failed or
    stopped, as the ``EngineWorker``'s; ``ready`` is set once loading ended either way."""

    def __init__(self, sides: list[SideEngine], lane: JobLane | None = None) -> None:
        super().__init__(name="mlxcel-side-engine", daemon=True)
        self.sides = sides
        self.lane = lane or JobLane()
        self.state = "loading"
        self.error: str | None = None
        self.ready = threading.Event()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self.buffers = BufferRelease()

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
        """Run one batch of queued jobs, waiting (up to the idle-release time) for one when
        ``block``; True when a batch ran."""
        if block and not self.lane.pending():
            self._wakeup.wait(self.buffers.idle_s)
        self._wakeup.clear()
        return self.lane.run_one()

    def run(self) -> None:
        try:
            load_sides(self.sides)
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
        self.lane.close("server shutting down" if self.state == "stopped"
                        else f"engine stopped: {self.error}")
