"""How the job lane forms batches across concurrent one-input requests: a burst shares one
forward, requests that trickle in gather into fewer, larger batches than running each
arrival at once, a lone client never waits, and the engine trace gets a line per
batch."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import mlxcel.engine.lanes as lanes
import pytest
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import Job, JobLane, LaneLimits
from mlxcel.engine.trace import Trace

LIMITS = LaneLimits(depth=64, timeout_s=30, batch_items=16)


def _flat(seconds: float, sizes: list[int]):
    """A forward that costs the same for 1 row as for 16 (a launch-bound GPU's)."""
    def fn(batch: list[int]) -> list[int]:
        sizes.append(len(batch))
        time.sleep(seconds)
        return [x * 2 for x in batch]
    return fn


def _serve(coro_of):
    """Run ``coro_of(client)`` against a started side-only ``LaneWorker``."""
    worker = LaneWorker([])
    worker.start()
    assert worker.ready.wait(10)
    try:
        return asyncio.run(coro_of(worker.client()))
    finally:
        worker.shutdown()


def test_sixteen_one_input_jobs_submitted_together_run_in_at_most_two_batches():
    sizes: list[int] = []
    fn = _flat(0.005, sizes)

    async def burst(client):
        return await asyncio.gather(*(client.call(Job("embed", "k", [i], fn), LIMITS)
                                      for i in range(16)))

    assert _serve(burst) == [[i * 2] for i in range(16)]
    assert sum(sizes) == 16 and len(sizes) <= 2


class _Stepping(threading.Thread):
    """A chat ``EngineWorker`` with nothing to decode, its thread driven by ``step()``."""

    def __init__(self, worker) -> None:
        super().__init__(daemon=True)
        self.worker, self.stop = worker, threading.Event()
        self.lane, self.wake = worker.lane, worker.wake

    def run(self) -> None:
        while not self.stop.is_set():
            self.worker.step()

    def shutdown(self) -> None:
        self.stop.set()
        self.wake()
        self.join(10)


def _side_only() -> LaneWorker:
    worker = LaneWorker([])
    worker.start()
    assert worker.ready.wait(10)
    return worker


def _trickle(total: int, every_s: float, forward_s: float, started=_side_only) -> list[int]:
    """One-input jobs submitted ``every_s`` apart (requests arriving one by one, as the
    HTTP side hands them over) to a started worker (a side-only ``LaneWorker`` unless
    ``started`` gives another); the batch sizes it ran."""
    sizes: list[int] = []
    fn = _flat(forward_s, sizes)
    worker = started()
    try:
        for i in range(total):
            worker.lane.submit(Job("embed", "k", [i], fn), LIMITS)
            worker.wake()
            time.sleep(every_s)
        deadline = time.monotonic() + 10
        while sum(sizes) < total and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        worker.shutdown()
    assert sum(sizes) == total
    return sizes


def test_trickling_requests_gather_into_fewer_batches(monkeypatch):
    """A job every millisecond, a forward of 4 ms whatever its size: run at once, each
    batch holds what came during the last forward; gathering waits one forward more, so
    each batch holds about twice that (never more than the batch size)."""
    monkeypatch.setattr(lanes, "GATHER_MAX_S", 0.0)
    at_once = _trickle(64, every_s=0.001, forward_s=0.004)
    monkeypatch.undo()
    gathered = _trickle(64, every_s=0.001, forward_s=0.004)
    assert len(gathered) <= 0.75 * len(at_once), (gathered, at_once)
    assert max(gathered) <= 16


def test_a_chat_engine_with_nothing_to_decode_gathers_side_batches_too(path, monkeypatch):
    """A chat model's engine thread serves the lane between steps; while no stream
    decodes it waits out a gathering batch instead of running each arrival at once."""
    from mlxcel.testing.engine import worker_for

    def started() -> _Stepping:
        stepping = _Stepping(worker_for(path))
        stepping.start()
        return stepping

    monkeypatch.setattr(lanes, "GATHER_MAX_S", 0.0)
    at_once = _trickle(64, every_s=0.001, forward_s=0.004, started=started)
    monkeypatch.undo()
    gathered = _trickle(64, every_s=0.001, forward_s=0.004, started=started)
    assert len(gathered) <= 0.75 * len(at_once), (gathered, at_once)
    assert max(gathered) <= 16


def _batch_of(lane: JobLane, seconds: float, arrive: int = 0) -> None:
    """Queue one job and run it as a batch that takes ``seconds``, during which
    ``arrive`` more jobs are submitted."""
    def fn(batch: list[int]) -> list[int]:
        for i in range(arrive):
            lane.submit(Job("embed", "k", [i], lambda b: b), LIMITS)
        time.sleep(seconds)
        return batch
    lane.submit(Job("embed", "k", [0], fn), LIMITS)
    assert lane.due_in() == 0.0 and lane.run_one()


def test_a_partial_batch_waits_only_while_jobs_arrive_densely():
    lane, noop = JobLane(), (lambda batch: batch)
    assert lane.due_in() == float("inf")
    for _ in range(3):  # a lone client: one job per forward, each after the last ended
        _batch_of(lane, 0.005)
    lane.submit(Job("embed", "k", [1], noop), LIMITS)
    assert lane.due_in() == 0.0  # runs at once
    assert lane.run_one()

    _batch_of(lane, 0.005, arrive=2)  # three submits within one forward's time
    wait = lane.due_in()
    spent = lane._last_batch["embed"][1]  # the forward's measured time (sleep + load)
    assert 0.0 < wait <= min(spent, lanes.GATHER_MAX_S)  # 2 of 16: gathers, one forward at most
    for i in range(14):
        lane.submit(Job("embed", "k", [i], noop), LIMITS)
    assert lane.due_in() == 0.0  # full: no reason to wait
    assert lane.run_one() and not lane.pending()
    lane.submit(Job("embed", "k", [1], noop), LIMITS)
    time.sleep(0.005)
    assert lane.due_in() == 0.0  # the window (the last batch's time) is over


@pytest.mark.parametrize("fails", [False, True])
def test_the_engine_trace_gets_a_line_per_side_batch(tmp_path, fails):
    path = tmp_path / "trace.jsonl"
    lane = JobLane()
    lane.trace = Trace(str(path))

    def fn(batch: list[int]) -> list[int]:
        if fails:
            raise ValueError("boom")
        return batch

    async def main() -> None:
        since = time.perf_counter()
        await asyncio.sleep(0.002)  # the HTTP side's work before the submit
        call = asyncio.ensure_future(lane_client.call(
            Job("embed", "k", [1, 2], fn, since=since), LIMITS))
        await asyncio.sleep(0.01)
        lane.run_one()
        try:
            await call
        except Exception:
            assert fails
        lane.submit(Job("embed", "k", [3], lambda b: b), LIMITS)
        lane.run_one()  # its line carries the first caller's hand-back

    lane_client = lanes.LaneClient(lane, lambda: None)
    asyncio.run(main())
    lane.trace.flush()
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert (first["side"], first["items"], first["jobs"]) == ("embed", 2, 1)
    assert first["intake_ms"] >= 2 and first["wait_ms"] >= 5 and "side_ms" in first
    assert "intake_ms" not in second and second["items"] == 1
    assert ("deliver_ms" in second) is not fails and second.get("delivered", 1) == 1
