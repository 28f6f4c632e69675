"""The job lane's overlap: a batch that a runner queues on the device (``Later``) is read
only after the next due batch has been built and queued, never across a decode step or
an idle wait, and a read that fails fails that batch's jobs only."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.engine.lanes import Job, JobLane, LaneClient, LaneLimits
from mlxcel.errors import GenerationFailed
from mlxcel.families.tasks import Later, resolved

LIMITS = LaneLimits(depth=16, timeout_s=5, batch_items=2)


def _logged(events: list[str], fail_read: set[int] = frozenset()):
    """A runner whose batches log their queueing and their read."""
    def fn(batch: list[int]) -> Later:
        events.append(f"queue {batch}")

        def read() -> list[int]:
            events.append(f"read {batch}")
            if batch[0] in fail_read:
                raise ValueError("device error")
            return [x * 10 for x in batch]
        return Later(read)
    return fn


def _queue(lane: JobLane, loop: asyncio.AbstractEventLoop, items: list[list[int]], fn
           ) -> list[asyncio.Future]:
    futures = []
    for job_items in items:
        job = Job("embed", "k", job_items, fn)
        job._loop, job._future = loop, loop.create_future()
        lane.submit(job, LIMITS)
        futures.append(job._future)
    return futures


def _run(coro):
    return asyncio.run(coro)


def _drain(lane: JobLane) -> None:
    """Run batches until none is queued or in flight (a partial batch may gather)."""
    while lane.pending() or lane._inflight is not None:
        lane.run_due(decoding=False)


def test_each_batch_is_read_after_the_next_one_is_queued():
    lane, events = JobLane(), []

    async def main():
        loop = asyncio.get_running_loop()
        futures = _queue(lane, loop, [[1, 2], [3, 4], [5, 6]], _logged(events))
        _drain(lane)
        return await asyncio.gather(*futures)

    assert _run(main()) == [[10, 20], [30, 40], [50, 60]]
    assert events == ["queue [1, 2]", "queue [3, 4]", "read [1, 2]",
                      "queue [5, 6]", "read [3, 4]", "read [5, 6]"]
    assert lane._inflight is None and lane.open_jobs("embed") == 0


def test_a_lone_batch_is_read_at_once():
    lane, events = JobLane(), []

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[7]], _logged(events))
        assert lane.run_due(decoding=False)
        assert lane._inflight is None  # nothing followed it: read before returning
        return await futures[0]

    assert _run(main()) == [70]
    assert events == ["queue [7]", "read [7]"]


def test_no_batch_stays_in_flight_while_streams_decode():
    lane, events = JobLane(), []

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[1, 2], [3, 4]],
                         _logged(events))
        assert lane.run_due(decoding=False)
        assert lane._inflight is not None  # the next batch was due
        lane.run_due(decoding=True)  # streams began: read it before their step
        assert lane._inflight is None
        assert events[:2] == ["queue [1, 2]", "read [1, 2]"]  # read before [3, 4] ran
        _drain(lane)
        return await asyncio.gather(*futures)

    assert _run(main()) == [[10, 20], [30, 40]]


def test_a_failed_read_fails_its_batch_only_and_the_next_still_answers():
    lane, events = JobLane(), []

    async def main():
        loop = asyncio.get_running_loop()
        futures = _queue(lane, loop, [[1, 2], [3, 4]], _logged(events, fail_read={1}))
        _drain(lane)
        return await asyncio.gather(*futures, return_exceptions=True)

    bad, good = _run(main())
    assert isinstance(bad, Exception) and "embed job failed: ValueError" in str(bad)
    assert good == [30, 40]
    assert lane.open_jobs("embed") == 0


def test_a_job_split_over_two_batches_fails_once_when_its_first_read_fails():
    lane, events = JobLane(), []

    async def main():
        loop = asyncio.get_running_loop()
        futures = _queue(lane, loop, [[1, 2, 3], [4]], _logged(events, fail_read={1}))
        _drain(lane)
        return await asyncio.gather(*futures, return_exceptions=True)

    split, other = _run(main())
    assert isinstance(split, Exception)
    assert other == [40] and lane.open_jobs("embed") == 0


def test_closing_fails_the_jobs_of_a_batch_in_flight():
    lane, events = JobLane(), []

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[1, 2], [3, 4]],
                         _logged(events))
        lane.run_due(decoding=False)
        assert lane._inflight is not None
        lane.close("server shutting down")
        return await asyncio.gather(*futures, return_exceptions=True)

    first, second = _run(main())
    assert isinstance(first, GenerationFailed) and isinstance(second, GenerationFailed)
    assert "read [1, 2]" not in events and lane.open_jobs("embed") == 0


def test_a_device_batch_read_later_equals_one_read_at_once():
    """MLX's own async_eval: what a Later reads after another batch was queued is what an
    eager evaluation of the same batch gives."""
    w = mx.random.normal((64, 64), key=mx.random.key(0))

    def fn(batch: list[int]) -> Later:
        x = mx.stack([mx.full((64,), float(v)) for v in batch]) @ w
        out = mx.tanh(x).sum(axis=1)
        mx.async_eval(out)
        return Later(lambda: np.array(out).tolist())

    lane = JobLane()

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[1, 2], [3, 4], [5, 6]], fn)
        _drain(lane)
        return await asyncio.gather(*futures)

    got = [v for batch in _run(main()) for v in batch]
    want = [v for b in ([1, 2], [3, 4], [5, 6]) for v in resolved(fn(b))]
    assert got == pytest.approx(want)


def test_lane_client_results_arrive_through_the_overlap():
    lane, events = JobLane(), []
    client = LaneClient(lane, lambda: None)

    async def main():
        calls = [asyncio.ensure_future(client.call(Job("embed", "k", [i, i + 1],
                                                       _logged(events)), LIMITS))
                 for i in (1, 3, 5)]
        await asyncio.sleep(0.01)
        _drain(lane)
        return await asyncio.gather(*calls)

    assert _run(main()) == [[10, 20], [30, 40], [50, 60]]
    assert events.index("queue [3, 4]") < events.index("read [1, 2]")


def test_a_side_only_engine_thread_overlaps_its_batches():
    from mlxcel.engine.lane_worker import LaneWorker

    lane, events = JobLane(), []

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[1, 2], [3, 4], [5, 6]],
                         _logged(events))
        worker = LaneWorker([], lane=lane)
        worker.start()
        try:
            return await asyncio.wait_for(asyncio.gather(*futures), 10)
        finally:
            worker.shutdown()

    assert _run(main()) == [[10, 20], [30, 40], [50, 60]]
    assert events == ["queue [1, 2]", "queue [3, 4]", "read [1, 2]",
                      "queue [5, 6]", "read [3, 4]", "read [5, 6]"]


def test_a_chat_engine_with_nothing_to_decode_overlaps_and_reads_before_idling(path):
    from mlxcel.testing.engine import worker_for

    worker = worker_for(path)
    lane, events = worker.lane, []

    async def main():
        futures = _queue(lane, asyncio.get_running_loop(), [[1, 2], [3, 4], [5, 6]],
                         _logged(events))
        for _ in range(3):
            worker.step()
        assert lane._inflight is None  # nothing left to run: the last batch was read
        return await asyncio.gather(*futures)

    assert _run(main()) == [[10, 20], [30, 40], [50, 60]]
    assert events == ["queue [1, 2]", "queue [3, 4]", "read [1, 2]",
                      "queue [5, 6]", "read [3, 4]", "read [5, 6]"]
