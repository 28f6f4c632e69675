"""Queue admission: ``--max-queue-depth`` bounds the requests waiting for a slot at every
moment, churn included (a slot between two sequences does not open the queue)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from mlxcel.engine.client import EngineClient
from mlxcel.errors import Overloaded
from mlxcel.types import GenerationRequest


def client(parallel: int, depth: int, busy: int) -> EngineClient:
    """An engine client whose thread never runs: ``busy`` slots hold a live row, and
    submitted requests stay queued (the engine never admits them)."""
    engine = EngineClient(lambda: None, parallel=parallel, max_queue_depth=depth)
    engine.worker.state = "ready"
    engine.worker.checkpoint = SimpleNamespace(config=None)
    engine.estimate_bytes = lambda req: 0
    engine.worker.memory_budget = 1
    rows = [SimpleNamespace(finished=False) for _ in range(busy)]
    engine.worker.batch = SimpleNamespace(rows=rows) if rows else None
    return engine


def submit_until_refused(engine: EngineClient, limit: int = 100) -> int:
    async def go() -> int:
        for n in range(limit):
            req = GenerationRequest(request_id=f"r{n}", prompt_tokens=(1, 2, 3), max_tokens=1)
            try:
                engine.submit(req)
            except Overloaded:
                return n
        return limit
    return asyncio.run(go())


@pytest.mark.parametrize(("busy", "accepted"), [
    (3, 2),  # one slot between sequences: the queue holds its limit, no more
    (4, 2),  # every slot busy
    (0, 4),  # at rest: the free slots take their waiters even past the limit
])
def test_waiters_never_exceed_the_depth_or_the_free_slots(busy, accepted):
    engine = client(parallel=4, depth=2, busy=busy)
    assert submit_until_refused(engine) == accepted
    assert engine.queue_depth == accepted


def test_a_churning_slot_does_not_open_the_queue():
    engine = client(parallel=2, depth=3, busy=2)
    assert submit_until_refused(engine) == 3
    engine.worker.batch.rows.pop()  # a row finishes: its slot is between sequences
    assert submit_until_refused(engine) == 0  # three already wait for that slot
    assert engine.queue_depth == 3
