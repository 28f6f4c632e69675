"""The engine's distributed hooks, as a worker that runs alone has them: doing nothing.

``EngineWorker.dist`` is always one of these: ``Alone`` on one device, rank 0's
``Leader`` (records and broadcasts), or a ``Follower`` (replays; its hooks stay inert
since rank 0 decides). The worker calls a hook at each operation that changes what the
ranks hold, so the single-device path pays one no-op call per operation and no branch.
"""

from __future__ import annotations

from typing import Any


class Alone:
    """No other rank: every hook is a no-op."""

    active = False
    share_tokens: Any = None  # DecodeBatch.share: rank 0's tokens on every rank
    failure_hold_s = 0.0  # a failed server answers /health this much longer before exit

    def agree(self, worker: Any) -> None: ...
    def admitted(self, group: list[Any]) -> None: ...
    def prefill(self, budget: int, chunk: int) -> None: ...
    def dropped_job(self) -> None: ...
    def joined(self) -> None: ...
    def dropped(self) -> None: ...
    def launch(self) -> None: ...
    def read_back(self) -> None: ...
    def stored(self, keep: list[Any]) -> None: ...
    def cleared(self) -> None: ...
    def end_iteration(self, busy: bool) -> None: ...
    def stop(self) -> None: ...

    def fatal(self, exc: BaseException) -> str | None:
        """The engine's error for a failed step (None: the step failed alone and the
        engine serves on, failing the affected rows)."""
        return None

    def info(self) -> dict[str, Any] | None:
        """What /health and /props show of the world (None: no world)."""
        return None
