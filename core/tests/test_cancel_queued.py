"""A request cancelled while it waits or prefills gives its queue place and slot back at
the next engine step."""

from __future__ import annotations

from mlxcel.testing.engine import run_until_done, submit, worker_for


def test_cancelled_waiting_and_prefilling_requests_leave_at_once(tiny_checkpoint):
    worker = worker_for(tiny_checkpoint, chunk=16, parallel=1)
    long_prompt = [(3 * i) % 90 + 3 for i in range(200)]  # many 16-token chunks
    prefilling = submit(worker, long_prompt, 4)
    waiting = submit(worker, [3, 4, 5], 4)
    worker.step()
    assert worker.prefilling is not None and worker.queued == 1
    assert [s.sink for s in worker.waiting] == [waiting]
    waiting.cancelled = True
    worker.step()
    assert worker.queued == 0 and not worker.waiting
    assert waiting.last.finish_reason == "cancelled"
    prefilling.cancelled = True
    worker.step()
    assert worker.prefilling is None and not worker.active
    assert prefilling.last.finish_reason == "cancelled"
    after = submit(worker, [3, 4, 5], 4)  # the slot is free again
    run_until_done(worker, [after], settle=True)
    assert after.last.finish_reason == "length"
