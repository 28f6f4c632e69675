"""A drafter distribution's exactness check inside a mixed batch, and a drafter registry
with chosen plugins, for the tests of drafters that live outside core (MTP heads,
assistants): the same prompts, join/leave pattern and assertions for every drafter."""

from __future__ import annotations

from typing import Any

from mlxcel.drafters.registry import DrafterRegistry
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for
from mlxcel.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [20, 21, 22, 23] * 3, [40, 41, 42] * 9,
           [100, 200, 100, 200, 100, 200], [60 + i % 7 for i in range(21)]]
SILENT = {3}  # rows that never draft (speculative.n_max 0)


def run_mixed(checkpoint: Any, config: EngineConfig | None = None
              ) -> tuple[list[list[int]], list[Any], Any]:
    """``PROMPTS`` greedy on 3 slots, one engine step between submits, so rows join a
    running batch and leave it at different times; rows in ``SILENT`` never draft.
    Returns each row's tokens, each finish's usage, and the worker."""
    worker = worker_for(checkpoint, parallel=3, config=config, chunk=16)
    sinks = []
    for i, prompt in enumerate(PROMPTS):
        sink = ListSink()
        worker.enqueue(request(prompt, 24 + 3 * i, SamplingParams(temperature=0.0),
                               draft_max=0 if i in SILENT else None), sink)
        sinks.append(sink)
        worker.step()
    run_until_done(worker, sinks)
    return [s.tokens for s in sinks], [s.last.usage for s in sinks], worker


def check_greedy_beside_silent_rows(checkpoint: Any, config: EngineConfig, kind: str) -> None:
    """Greedy output with ``config``'s drafter equals the output without one, every
    drafting row ran verify rounds of ``kind``, and the silent rows none."""
    plain, _, _ = run_mixed(checkpoint)
    fast, usages, worker = run_mixed(checkpoint, config)
    assert fast == plain
    assert worker.spec is not None and not worker.spec.failed
    for i, usage in enumerate(usages):
        if i in SILENT:
            assert usage.draft_rounds == 0 and usage.draft_kind is None
        else:
            assert usage.draft_rounds > 0 and usage.draft_kind == kind, i


def registry_with(*plugins: Any) -> DrafterRegistry:
    """Core's built-in drafters plus those each of ``plugins`` registers."""
    from mlxcel.builtin import drafters as builtin

    reg = DrafterRegistry()
    for module in (builtin, *plugins):
        module.mlxcel_register_drafters(reg)
    return reg
