"""Never hang: each rank's watchdog ends a server whose distributed work stopped moving.

Rank 0 sends a message before every collective step and, idle, every ``PING_S``; a
follower receives each. So on any rank, no message for ``--distributed-timeout`` seconds
means a peer stopped answering inside a collective (a hung or unreachable rank: a dead
one makes MLX's ring backend raise at once, which fails the step instead). Rank 0 then
fails the engine as a dead engine thread does (``abort``: every open stream ends with an
error event, /health reports it, the server exits non-zero); a follower exits non-zero.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from mlxcel.engine.sequence import end_all

log = structlog.get_logger("mlxcel.distributed")
CHECK_S = 0.25


class Watchdog:
    """Calls ``on_timeout(reason)`` once when ``beat`` was not called for ``timeout`` s."""

    def __init__(self, timeout: float, on_timeout: Callable[[str], None], role: str) -> None:
        self.timeout = timeout
        self.on_timeout = on_timeout
        self.role = role
        self.last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"mlxcel-watchdog-{role}",
                                        daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(CHECK_S):
            silent = time.monotonic() - self.last
            if silent > self.timeout:
                why = (f"no distributed step finished for {silent:.0f} s (--distributed-"
                       f"timeout {self.timeout:g}): a rank hangs or cannot be reached")
                log.error("distributed_timeout", role=self.role, silent_s=round(silent, 1),
                          timeout_s=self.timeout)
                self._stopped.set()
                self.on_timeout(why)


def abort(worker: Any, message: str) -> None:
    """Fail rank 0's engine from outside its thread (which may be stuck in a collective):
    refuse new requests, end every open one with an error event, and leave the state
    ``failed`` so /health says why and the server exits (``mlxcel.serving``)."""
    log.error("distributed_failed", error=message)
    worker.requests.close()
    with worker.requests.lock:
        worker.error = message
        worker.state = "failed"
    end_all(worker.held(), worker.inbox, f"engine stopped: {message}")


def exit_follower(why: str) -> None:
    """A follower whose rank 0 is gone or silent ends at once, non-zero."""
    log.error("distributed_follower_exit", error=why)
    os._exit(1)
