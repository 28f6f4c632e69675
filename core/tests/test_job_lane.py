"""The engine's job lane: batching across requests by key, the bounded queue (503), the
timeout (504), a failing batch, closing; and the lane inside the engine worker's step and
in a side-only LaneWorker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import Job, JobLane, LaneClient, LaneLimits
from mlxcel.engine.side import SideEngine
from mlxcel.errors import GenerationFailed, Overloaded, RequestTimedOut
from mlxcel.testing.engine import ListSink, submit, worker_for


def _lane_client(lane: JobLane) -> LaneClient:
    return LaneClient(lane, lambda: None)


def _drain(lane: JobLane, stop: threading.Event) -> threading.Thread:
    """An 'engine thread' that runs batches until told to stop."""
    def run() -> None:
        while not stop.is_set():
            if not lane.run_one():
                time.sleep(0.001)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_jobs_of_one_key_share_batches_up_to_the_batch_size():
    lane, seen = JobLane(), []
    limits = LaneLimits(depth=8, timeout_s=5, batch_items=4)

    def fn(batch: list[str]) -> list[str]:
        seen.append(list(batch))
        return [item.upper() for item in batch]

    async def main() -> tuple[list[str], list[str], list[str]]:
        client = _lane_client(lane)
        a = asyncio.ensure_future(client.call(Job("embed", "k", ["a1", "a2", "a3"], fn), limits))
        b = asyncio.ensure_future(client.call(Job("embed", "k", ["b1", "b2"], fn), limits))
        c = asyncio.ensure_future(client.call(Job("embed", "other", ["c1"], fn), limits))
        await asyncio.sleep(0.01)  # all three queued before the engine runs any
        stop = threading.Event()
        _drain(lane, stop)
        try:
            return await a, await b, await c
        finally:
            stop.set()

    a, b, c = asyncio.run(main())
    assert (a, b, c) == (["A1", "A2", "A3"], ["B1", "B2"], ["C1"])
    assert seen[0] == ["a1", "a2", "a3", "b1"]  # two requests in one forward
    assert ["c1"] in seen and ["b2"] in seen  # another key never joins that batch
    assert all(len(batch) <= 4 for batch in seen)
    assert lane.open_jobs("embed") == 0


def test_a_full_queue_refuses_with_overloaded_and_reopens_when_drained():
    lane = JobLane()
    limits = LaneLimits(depth=2, timeout_s=5, batch_items=8)
    for i in range(2):
        lane.submit(Job("rerank", "k", [i], lambda b: b), limits)
    with pytest.raises(Overloaded, match="rerank queue is full"):
        lane.submit(Job("rerank", "k", [9], lambda b: b), limits)
    lane.submit(Job("embed", "k", [1], lambda b: b), limits)  # another task's own queue
    assert lane.run_one() and lane.run_one()
    assert lane.open_jobs("rerank") == 0
    lane.submit(Job("rerank", "k", [3], lambda b: b), limits)


def test_a_job_past_its_timeout_fails_with_504_and_is_never_run():
    lane, ran = JobLane(), []
    limits = LaneLimits(depth=4, timeout_s=0.05, batch_items=8)

    async def main() -> None:
        await _lane_client(lane).call(Job("embed", "k", ["x"], ran.extend), limits)

    with pytest.raises(RequestTimedOut, match="longer than 0.05 s"):
        asyncio.run(main())
    assert lane.pending()
    assert not lane.run_one()  # dropped as expired, not run
    assert ran == [] and lane.open_jobs("embed") == 0


def test_a_failing_batch_fails_its_jobs_only():
    lane = JobLane()
    limits = LaneLimits(depth=4, timeout_s=5, batch_items=1)

    def fn(batch: list[int]) -> list[int]:
        if batch == [0]:
            raise ValueError("boom")
        return batch

    async def main() -> tuple[object, object]:
        client = _lane_client(lane)
        bad = asyncio.ensure_future(client.call(Job("embed", "k", [0], fn), limits))
        good = asyncio.ensure_future(client.call(Job("embed", "k", [1], fn), limits))
        await asyncio.sleep(0.01)
        stop = threading.Event()
        _drain(lane, stop)
        try:
            return await asyncio.gather(bad, good, return_exceptions=True)
        finally:
            stop.set()

    bad, good = asyncio.run(main())
    assert isinstance(bad, Exception) and "embed job failed: ValueError" in str(bad)
    assert good == [1]
    assert lane.open_jobs("embed") == 0


def test_closing_fails_queued_jobs_and_refuses_new_ones():
    lane = JobLane()
    limits = LaneLimits()

    async def main() -> None:
        waiting = asyncio.ensure_future(
            _lane_client(lane).call(Job("embed", "k", [1], lambda b: b), limits))
        await asyncio.sleep(0.01)
        lane.close("server shutting down")
        await waiting

    with pytest.raises(GenerationFailed, match="shutting down"):
        asyncio.run(main())
    with pytest.raises(GenerationFailed):
        lane.submit(Job("embed", "k", [1], lambda b: b), limits)


def test_side_jobs_run_between_decode_steps_and_the_stream_keeps_stepping(tiny_checkpoint):
    """A queue of side jobs runs one batch per engine step: a decoding row gets a token
    in every step while they run."""
    worker = worker_for(tiny_checkpoint)
    worker.lane.turns.share = 1.0  # every step may run a batch (the share rule is tested below)
    sink: ListSink = submit(worker, [1, 2, 3, 4], max_tokens=40)
    worker.step()  # admitted and prefilled
    limits = LaneLimits(depth=64, timeout_s=30, batch_items=2)
    ran: list[int] = []
    for i in range(10):
        worker.lane.submit(Job("embed", "k", [i, i], lambda b: ran.extend(b) or b), limits)
    tokens = []
    for _ in range(10):
        before = sum(len(e.token_ids) for e in sink.events)
        worker.step()
        tokens.append(sum(len(e.token_ids) for e in sink.events) - before)
    assert len(ran) == 20 and not worker.lane.pending()
    assert all(n >= 1 for n in tokens[1:])  # decoding never paused for the side jobs


def test_a_lane_worker_loads_its_side_models_then_serves_their_jobs():
    lane = JobLane()
    client = LaneClient(lane, lambda: None)
    side = SideEngine("embed", "tiny", lambda: "runner", client, LaneLimits(batch_items=3))
    worker = LaneWorker([side], lane)
    worker.start()
    try:
        assert worker.ready.wait(10) and worker.state == "ready" and side.runner == "runner"

        async def main() -> list[int]:
            side.lane = worker.client()
            return await side.run([1, 2, 3, 4], "k", lambda b: [x * 10 for x in b])

        assert asyncio.run(main()) == [10, 20, 30, 40]
    finally:
        worker.shutdown()
    assert worker.state == "stopped"


def test_a_side_model_that_fails_to_load_fails_its_worker_with_its_name():
    def fail() -> None:
        raise FileNotFoundError("no weights")

    side = SideEngine("rerank", "ranker", fail, LaneClient(JobLane(), lambda: None),
                      LaneLimits())
    worker = LaneWorker([side])
    worker.start()
    worker.join(10)
    assert worker.state == "failed" and "rerank model ranker failed to load" in worker.error
    with pytest.raises(GenerationFailed, match="failed to load"):
        _ = side.runner


def test_while_streams_decode_side_jobs_wait_out_their_share():
    """A batch that took t seconds is followed by t * (1 - share) / share seconds without
    side jobs while streams decode; with nothing decoding the next one runs at once, and
    streams that start right after it get that wait too."""
    lane = JobLane()
    limits = LaneLimits(depth=8, timeout_s=30, batch_items=1)
    for i in range(3):
        lane.submit(Job("embed", "k", [i], lambda b: time.sleep(0.02) or b), limits)
    assert lane.run_due(decoding=True)
    assert not lane.run_due(decoding=True)  # within the 0.18 s that 0.02 s buys
    assert lane.run_due(decoding=False)  # nothing decodes: no wait
    assert not lane.run_due(decoding=True)  # streams that start now: the same wait
    time.sleep(0.2)
    assert lane.run_due(decoding=True) and not lane.pending()
