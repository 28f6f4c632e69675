"""Engine timeline for diagnosis: ``--engine-trace /path/file.jsonl`` (``MLXCEL_ENGINE_TRACE``).

One JSON line per engine iteration that did any work: its start (seconds since the engine
became ready), requests that arrived, rows waiting, the prefill group's rows x columns and
time, the decode batch size and the time spent launching and reading back its step, a
speculative round's drafting (``propose_ms``) and verify step with its phases
(``verify_ms``; ``verify_chain_ms``, ``verify_graph_ms``, ``verify_sync_ms``,
``verify_post_ms``: see ``engine.verify.verify_step``), and the prompt-cache store time. Each timed phase has its wall time (``build_ms``) and the
engine thread's CPU time in it (``build_cpu_ms``): a phase whose wall time exceeds its CPU
time waited, for the GIL (another thread's Python) or for the device. Lines are written in blocks (and at shutdown), so tracing
costs a dictionary per iteration. Off (no file) unless a path is set: the engine then
holds ``NullTrace``, whose methods do nothing, so it never asks whether it traces.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

FLUSH_EVERY = 256


class NullTrace:
    """No tracing: every call does nothing (``timed`` only runs the function)."""

    enabled = False

    def begin(self) -> None: ...

    def note(self, **fields: Any) -> None: ...

    def add_ms(self, key: str, since: float) -> None: ...

    def lap(self, key: str | None = None, mark: Any = None) -> Any:
        return None

    def end(self) -> None: ...

    def flush(self) -> None: ...

    def timed(self, key: str, fn: Callable[[], Any]) -> Any:
        return fn()


class Trace(NullTrace):
    enabled = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.t0 = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        open(path, "w").close()  # noqa: SIM115 - truncate; fails early on a bad path

    @classmethod
    def to(cls, path: str | None) -> NullTrace:
        """A trace writing to ``path``, or a ``NullTrace`` when there is none."""
        return cls(path) if path else NullTrace()

    def timed(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its wall time noted as ``key`` (ms) and this thread's CPU time in it
        as ``key`` with ``_cpu`` before ``_ms``."""
        mark = self.lap()
        try:
            return fn()
        finally:
            self.lap(key, mark)

    def begin(self) -> None:
        self.current = {"t": round(time.perf_counter() - self.t0, 6)}

    def note(self, **fields: Any) -> None:
        self.current.update(fields)

    def add_ms(self, key: str, since: float) -> None:
        self.current[key] = round((time.perf_counter() - since) * 1e3, 3)

    def lap(self, key: str | None = None, mark: Any = None) -> Any:
        """A mark of now (wall and this thread's CPU clock); with ``key`` and an earlier
        ``mark``, the phase between them noted as ``timed`` notes it. For phases of one
        function that a lambda cannot wrap: ``m = trace.lap(); ...; m = trace.lap("a_ms",
        m)``."""
        now = (time.perf_counter(), time.thread_time())
        if key is not None and mark is not None:
            self.current[key] = round((now[0] - mark[0]) * 1e3, 3)
            self.current[key.removesuffix("_ms") + "_cpu_ms"] = round(
                (now[1] - mark[1]) * 1e3, 3)
        return now

    def end(self) -> None:
        if len(self.current) > 1:
            self.rows.append(self.current)
            if len(self.rows) >= FLUSH_EVERY:
                self.flush()
        self.current = {}

    def flush(self) -> None:
        if self.rows:
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.rows)
            self.rows = []
