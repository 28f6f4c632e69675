"""Continuous batching: joins, priorities, admission control, isolation of failures."""

from __future__ import annotations

import asyncio
import time

import pytest
from mlxcel.engine.client import MAX_BUFFERED_EVENTS
from mlxcel.engine.sequence import Sequence
from mlxcel.errors import Overloaded
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.engine import engine_for
from mlxcel.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def f32_checkpoint(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


def make_engine(path, parallel, prefill_chunk=512, **kw):
    return engine_for(path, parallel, chunk=prefill_chunk, **kw)


@pytest.fixture
def engine_factory(f32_checkpoint):
    made = []

    def factory(**kw):
        made.append(make_engine(f32_checkpoint, **kw))
        return made[-1]
    yield factory
    for e in made:
        e.shutdown()


def req(rid, prompt_len=8, max_tokens=12, priority=1, start=1, **kw):
    return GenerationRequest(request_id=rid, prompt_tokens=tuple(range(start, start + prompt_len)),
                             max_tokens=max_tokens, sampling=kw.pop("sampling", GREEDY),
                             ignore_eos=True, priority=priority, **kw)


async def collect(engine, request, log=None):
    ids, last = [], None
    async for event in engine.submit(request):
        ids.extend(event.token_ids)
        if log is not None:
            log.append((request.request_id, time.perf_counter()))
        last = event
    return ids, last


def test_batched_greedy_output_equals_solo_output(engine_factory):
    engine = engine_factory(parallel=4)
    solo = asyncio.run(collect(engine, req("solo", prompt_len=5, start=3)))[0]

    async def together():
        return await asyncio.gather(
            collect(engine, req("a", prompt_len=17, start=40)),
            collect(engine, req("x", prompt_len=5, start=3)),
            collect(engine, req("b", prompt_len=2, start=90)),
            collect(engine, req("c", prompt_len=30, start=7)))
    results = asyncio.run(together())
    assert results[1][0] == solo
    assert all(len(ids) == 12 for ids, _ in results)


def test_rows_decode_in_one_batch(engine_factory):
    engine = engine_factory(parallel=4)
    seen = []

    async def run():
        async def watch():
            for _ in range(400):
                seen.append(len(engine.worker.batch))
                await asyncio.sleep(0.002)
        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(collect(engine, req(f"r{i}", max_tokens=200)) for i in range(4)))
        watcher.cancel()
    asyncio.run(run())
    assert max(seen) == 4
    stats = engine.stats
    assert stats.decode_steps_processed < stats.total_decode_tokens


def test_priorities_order_the_queue(engine_factory):
    engine = engine_factory(parallel=1)
    log: list = []

    async def run():
        blocker = asyncio.create_task(collect(engine, req("blocker", max_tokens=400), log))
        await asyncio.sleep(0.05)
        tasks = [asyncio.create_task(collect(engine, req(name, max_tokens=3, priority=p), log))
                 for name, p in (("low", 2), ("normal", 1), ("high", 0), ("normal2", 1))]
        await asyncio.gather(blocker, *tasks)
    asyncio.run(run())
    first = {}
    for rid, t in log:
        first.setdefault(rid, t)
    order = sorted(("low", "normal", "high", "normal2"), key=first.get)
    assert order == ["high", "normal", "normal2", "low"]


def test_full_queue_is_refused_at_once(engine_factory):
    engine = engine_factory(parallel=1, max_queue_depth=2)

    async def run():
        running = engine.submit(req("run", max_tokens=500))
        await running.__anext__()
        queued = [engine.submit(req(f"q{i}", max_tokens=2)) for i in range(2)]
        with pytest.raises(Overloaded, match="busy"):
            engine.submit(req("too-many"))
        for stream in [running, *queued]:
            stream.cancel()
    asyncio.run(run())
    deadline = time.time() + 5
    while engine.queue_depth and time.time() < deadline:
        time.sleep(0.01)
    assert engine.queue_depth == 0 and engine.active_count == 0


def test_long_prompt_prefill_interleaves_with_decoding(engine_factory):
    engine = engine_factory(parallel=2, prefill_chunk=16)
    log: list = []

    async def run():
        runner = asyncio.create_task(collect(engine, req("run", max_tokens=150), log))
        while not log:
            await asyncio.sleep(0.001)
        submitted = time.perf_counter()
        long_ids, _ = await collect(engine, req("long", prompt_len=400, max_tokens=1), log)
        await runner
        return submitted
    submitted = asyncio.run(run())
    long_first = next(t for rid, t in log if rid == "long")
    during = [t for rid, t in log if rid == "run" and submitted < t < long_first]
    assert engine.stats.prefill_chunks_processed >= 400 // 16
    assert len(during) >= 10  # the running stream kept flowing while 25 chunks prefilled


def test_failure_in_one_row_leaves_the_others_correct(engine_factory, monkeypatch):
    engine = engine_factory(parallel=3)
    expected = asyncio.run(collect(engine, req("ok", prompt_len=6)))[0]
    original = Sequence.accept

    def flaky(self, token, *args):
        if self.req.request_id == "bad" and self.generated == 3:
            raise RuntimeError("injected")
        original(self, token, *args)
    monkeypatch.setattr(Sequence, "accept", flaky)

    async def run():
        return await asyncio.gather(collect(engine, req("bad", prompt_len=9, start=50)),
                                    collect(engine, req("ok", prompt_len=6)))
    (bad_ids, bad_last), (ok_ids, ok_last) = asyncio.run(run())
    assert bad_last.finish_reason == "error" and "injected" in bad_last.error
    assert ok_last.finish_reason == "length" and ok_ids == expected
    assert asyncio.run(collect(engine, req("after", prompt_len=6)))[0] == expected


def test_slow_reader_buffer_is_bounded_and_loses_no_text(engine_factory):
    engine = engine_factory(parallel=2)
    whole = asyncio.run(collect(engine, req("fast", max_tokens=300)))[0]

    async def run():
        stream = engine.submit(req("slow", max_tokens=300))
        while engine.stats.sequences_completed < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        buffered = stream.buffered
        ids = [t async for e in stream for t in e.token_ids]
        return buffered, ids
    buffered, ids = asyncio.run(run())
    assert buffered <= MAX_BUFFERED_EVENTS + 1
    assert ids == whole


def test_a_model_whose_cache_cannot_batch_runs_one_slot(f32_checkpoint):
    """A cache class with no batch form (no ``merge``; a family's own kind, and no
    ``batch_cache`` factory for it) runs one slot with no prompt cache."""
    from mlx_lm.models.cache import KVCache

    class Unbatchable(KVCache):
        merge = None

    families = load_plugins().families

    def load():
        ckpt = load_checkpoint(str(f32_checkpoint), families)
        model = ckpt.model
        model.make_cache = lambda: [Unbatchable() for _ in model.model.layers]
        return ckpt

    engine = engine_for(load, 4, cache=1 << 20)
    try:
        async def run():
            return await asyncio.gather(*(collect(engine, req(f"s{i}", start=i + 1))
                                          for i in range(3)))
        results = asyncio.run(run())
        assert engine.parallel == 1 and engine.worker.batchable is False
        stats = engine.prompt_cache.stats()
        assert stats["enabled"] is False and "cannot be batched" in stats["disabled_reason"]
        assert all(last.finish_reason == "length" and len(ids) == 12 for ids, last in results)
    finally:
        engine.shutdown()
