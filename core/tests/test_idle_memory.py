"""MLX's buffer cache is freed on the engine thread once it has been idle for a while after
work, and at once after a prompt-cache reset; the prompt cache's entries and the weights
stay."""

from __future__ import annotations

import time

import mlx.core as mx
from mlxcel.testing.engine import run_until_done, submit, worker_for


def idle_worker(path, cache: bool):
    worker = worker_for(path, cache=cache, chunk=256, parallel=4)
    worker.idle_release = 0.3
    return worker


def idle_out(worker) -> None:
    """Iterate past the idle delay (the loop wakes at least every 0.5 s when idle)."""
    worker.step()
    time.sleep(worker.idle_release + 0.05)
    worker.step()


def finish_and_hold(worker, sinks) -> int:
    """Run ``sinks`` to their finish events; the buffer cache held at that moment."""
    for _ in range(2000):
        if all(s.done for s in sinks):
            return mx.get_cache_memory()
        worker.step()
    raise AssertionError("requests did not finish")


def test_a_big_request_leaves_no_buffer_cache_once_idle(tiny_checkpoint):
    worker = idle_worker(tiny_checkpoint, cache=False)
    big = [submit(worker, [(7 * i) % 200 + 3 for i in range(1500)], 4)
           for _ in range(3)]
    held = finish_and_hold(worker, big)
    assert held > 0  # the prefill's buffers were returned to MLX's cache, not the system
    worker.step()  # drops the finished rows: the engine is idle
    assert not worker._busy()
    assert mx.get_cache_memory() > 0  # kept for a request that follows at once
    idle_out(worker)
    assert mx.get_cache_memory() == 0


def test_a_prompt_cache_reset_frees_its_buffers_on_the_engine_thread(tiny_checkpoint):
    worker = idle_worker(tiny_checkpoint, cache=True)
    sink = submit(worker, [(5 * i) % 100 + 3 for i in range(600)], 4)
    run_until_done(worker, [sink], settle=True)
    idle_out(worker)
    assert worker.prompt_cache.bytes > 0
    assert mx.get_cache_memory() == 0  # idle: cleared, the cache entry itself kept
    worker.prompt_cache.reset()  # as /v1/cache/reset does, from an HTTP thread
    assert mx.get_cache_memory() > 0  # the entry's arrays went to MLX's buffer cache
    worker.step()  # woken by the reset
    assert mx.get_cache_memory() == 0
