"""SideEngine: a side model (an embedder, a reranker, ...) served through the engine's job
lane. Routes call ``await side.run(items, key, fn)``; the model is loaded, and ``fn`` runs,
on the engine thread only."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from mlxcel.engine.lanes import Job, LaneClient, LaneLimits
from mlxcel.engine.served import ServedTotals
from mlxcel.errors import GenerationFailed, ModelLoading
from mlxcel.families.tasks import Later

PROMPT_TASKS = frozenset({"embed", "rerank"})  # tasks whose items are token sequences


class SideEngine:
    """One side model, by task.

    ``task``: ``embed`` or ``rerank`` (later ``transcribe``, ``speak``, ...). ``name``: its
    display name (``/v1/models``). ``load()`` runs on the engine thread and returns the
    task's runner (``mlxcel.families.tasks``); ``runner`` raises ``ModelLoading`` until it
    has, and ``GenerationFailed`` if it failed.
    """

    def __init__(self, task: str, name: str, load: Callable[[], Any], lane: LaneClient,
                 limits: LaneLimits) -> None:
        self.task = task
        self.name = name
        self.load = load
        self.lane = lane
        self.limits = limits
        self.state = "loading"
        self.error: str | None = None
        self._runner: Any = None
        self.served = ServedTotals()  # prompts read (``PROMPT_TASKS``), for /metrics

    def loaded(self, runner: Any) -> None:
        """Engine thread: the model is ready."""
        self._runner, self.state = runner, "ready"

    def failed(self, error: str) -> None:
        """Engine thread: the model did not load."""
        self.error, self.state = error, "failed"

    @property
    def runner(self) -> Any:
        if self.state == "loading":
            raise ModelLoading("Loading model")
        if self.state == "failed":
            raise GenerationFailed(f"the {self.task} model failed to load: {self.error}")
        return self._runner

    async def run(self, items: list[Any], key: Hashable,
                  fn: Callable[[list[Any]], list[Any]], since: float | None = None
                  ) -> list[Any]:
        """``fn(batch)`` on the engine thread over ``items`` (maybe beside other requests'
        items of the same ``key``, in batches of at most ``batch_items``); one result per
        item, in order. ``Overloaded`` (503) when this task's queue is full,
        ``RequestTimedOut`` (504) past its timeout; an exception ``fn`` raises is raised
        here. ``since``: when the request arrived (``perf_counter``), for the trace."""
        _ = self.runner  # ModelLoading / GenerationFailed before queueing
        if self.task in PROMPT_TASKS:
            fn = self._counted(fn)
        return await self.lane.call(Job(task=self.task, key=key, items=items, fn=fn,
                                        since=since), self.limits)

    def _counted(self, fn: Callable[[list[Any]], list[Any]]
                 ) -> Callable[[list[Any]], list[Any]]:
        """``fn`` that adds each batch it runs (its items' tokens and its seconds) to
        ``served``: llama-server counts embedding and rerank prompts as prompt tokens."""
        def run(batch: list[Any]) -> list[Any] | Later:
            start = time.perf_counter()
            out = fn(batch)
            tokens = sum(len(item) for item in batch if hasattr(item, "__len__"))
            if not isinstance(out, Later):
                self.served.side_batch(tokens, time.perf_counter() - start)
                return out
            queued = time.perf_counter() - start

            def read() -> list[Any]:
                began = time.perf_counter()
                results = out.read()  # its time in flight is the next batch's
                self.served.side_batch(tokens, queued + time.perf_counter() - began)
                return results
            return Later(read)
        return run


def load_sides(sides: list[SideEngine]) -> None:
    """Engine thread: load every side model, in order. The first failure raises, naming the
    model: a server asked for a side model does not start without it."""
    for side in sides:
        try:
            runner = side.load()
        except Exception as exc:
            side.failed(f"{type(exc).__name__}: {exc}")
            raise RuntimeError(f"the {side.task} model {side.name} failed to load: "
                               f"{type(exc).__name__}: {exc}") from exc
        side.loaded(runner)
