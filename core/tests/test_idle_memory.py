"""MLX's buffer cache is freed on the engine thread once it has been idle for a while after
work, at once after a prompt-cache reset or a failed prefill, and after a prefill chunk
that left more than its bound; the prompt cache's entries and the weights stay."""

from __future__ import annotations

import time

import mlx.core as mx
from mlxcel.testing.engine import run_until_done, submit, worker_for


def idle_worker(path, cache: bool):
    worker = worker_for(path, cache=cache, chunk=256, parallel=4)
    worker.buffers.idle_s = 0.3
    return worker


def idle_out(worker) -> None:
    """Iterate past the idle delay (the loop wakes at least every 0.5 s when idle)."""
    worker.step()
    time.sleep(worker.buffers.idle_s + 0.05)
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


def prefill_holds(worker, prompt) -> list[int]:
    """The buffer cache held after each engine step that ran a prefill chunk of ``prompt``."""
    sink = submit(worker, prompt, 2)
    held = []
    for _ in range(2000):
        if sink.done:
            return held
        chunks = worker.stats.prefill_chunks_processed
        worker.step()
        if worker.stats.prefill_chunks_processed > chunks:
            held.append(mx.get_cache_memory())
    raise AssertionError("the request did not finish")


def test_a_long_prompt_does_not_pile_up_buffers_chunk_after_chunk(tiny_checkpoint):
    prompt = [(11 * i) % 200 + 3 for i in range(1500)]
    worker = idle_worker(tiny_checkpoint, cache=False)
    worker.buffers.held_bytes = float("inf")  # idle release only
    piled = prefill_holds(worker, prompt)
    assert len(piled) >= 5 and max(piled) > 0
    worker = idle_worker(tiny_checkpoint, cache=False)
    worker.buffers.held_bytes = min(x for x in piled if x > 0) - 1
    bounded = prefill_holds(worker, prompt)
    assert len(bounded) == len(piled)
    # every chunk that left more than the bound gave it back before the next one ran
    assert all(x == 0 or x <= worker.buffers.held_bytes for x in bounded), bounded


def test_a_failed_prefill_gives_the_buffer_cache_back_at_once(tiny_checkpoint):
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.testing.faults import raise_on_marker

    def load():
        ckpt = load_checkpoint(str(tiny_checkpoint), load_plugins().families)
        raise_on_marker(ckpt, "!", lambda: RuntimeError("out of memory"))
        return ckpt

    worker = worker_for(load, chunk=64, parallel=2)
    worker.buffers.idle_s = 3600.0  # only the failure can clear it
    marker = worker.checkpoint.tokenizer.hf.token_to_id("!")
    ok = submit(worker, [(3 * i) % 100 + 3 for i in range(300)], 3)
    run_until_done(worker, [ok])
    assert mx.get_cache_memory() > 0
    bad = submit(worker, [(3 * i) % 100 + 3 for i in range(200)] + [marker] * 70, 3)
    run_until_done(worker, [bad])
    assert bad.events[-1].error and "out of memory" in bad.events[-1].error
    assert mx.get_cache_memory() == 0
