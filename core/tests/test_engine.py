"""The engine thread driven through EngineClient with a real tiny model."""

from __future__ import annotations

import asyncio
import time

import pytest
from mlxcel.engine.client import EngineClient
from mlxcel.errors import ContextLengthExceeded, ModelLoading
from mlxcel.testing.engine import engine_for
from mlxcel.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    client = engine_for(tiny_checkpoint, 2)
    yield client
    client.shutdown()


def req(rid, prompt=(1, 2, 3, 4), max_tokens=8, sampling=GREEDY, **kw):
    return GenerationRequest(request_id=rid, prompt_tokens=tuple(prompt), max_tokens=max_tokens,
                             sampling=sampling, **kw)


async def run(engine, request):
    events = [e async for e in engine.submit(request)]
    return events


def tokens(events):
    return [t for e in events for t in e.token_ids]


def test_max_tokens_and_usage(engine):
    events = asyncio.run(run(engine, req("a", max_tokens=6, ignore_eos=True)))
    last = events[-1]
    assert last.finish_reason == "length"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 6)
    assert len(tokens(events)) == 6
    assert all(e.finish_reason is None for e in events[:-1])


def test_stops_at_eos(engine):
    ids = tokens(asyncio.run(run(engine, req("b", max_tokens=6, ignore_eos=True))))
    saved = set(engine.worker.eos_ids)
    engine.worker.eos_ids = {ids[2]}
    try:
        events = asyncio.run(run(engine, req("c", max_tokens=6)))
    finally:
        engine.worker.eos_ids = saved
    first_eos = ids.index(ids[2])
    assert events[-1].finish_reason == "stop"
    assert events[-1].usage.completion_tokens == first_eos + 1


def test_greedy_is_deterministic_and_seed_reproducible(engine):
    a = tokens(asyncio.run(run(engine, req("d", ignore_eos=True))))
    b = tokens(asyncio.run(run(engine, req("e", ignore_eos=True))))
    assert a == b
    seeded = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=1234)
    s1 = tokens(asyncio.run(run(engine, req("f", max_tokens=16, sampling=seeded,
                                            ignore_eos=True))))
    s2 = tokens(asyncio.run(run(engine, req("g", max_tokens=16, sampling=seeded,
                                            ignore_eos=True))))
    other = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=99)
    s3 = tokens(asyncio.run(run(engine, req("h", max_tokens=16, sampling=other,
                                            ignore_eos=True))))
    assert s1 == s2 and s1 != s3


def test_concurrent_requests_interleave(engine):
    async def both():
        order = []

        async def consume(name):
            async for _event in engine.submit(req(name, max_tokens=30, ignore_eos=True)):
                order.append(name)
                await asyncio.sleep(0)
        await asyncio.gather(consume("x"), consume("y"))
        return order

    order = asyncio.run(both())
    first_y = order.index("y")
    assert first_y < len(order) - 1 - order[::-1].index("x")  # y starts before x ends


def test_cancel_frees_the_slot(engine):
    async def cancel_midway():
        stream = engine.submit(req("z", max_tokens=10_000, ignore_eos=True))
        await stream.__anext__()
        assert len(engine.worker.active) == 1
        await stream.aclose()

    asyncio.run(cancel_midway())
    deadline = time.time() + 5
    while engine.worker.active and time.time() < deadline:
        time.sleep(0.01)
    assert engine.worker.active == []


def test_context_fit(engine):
    ctx = engine.context_size
    assert engine.fit(10, None) == ctx - 10
    assert engine.fit(10, 5) == 5
    with pytest.raises(ContextLengthExceeded):
        engine.fit(ctx, 1)


def test_submit_while_loading_is_refused():
    import threading

    gate = threading.Event()
    client = EngineClient(lambda: gate.wait(30), parallel=1)
    client.start()
    try:
        async def go():
            client.submit(req("l"))
        with pytest.raises(ModelLoading):
            asyncio.run(go())
    finally:
        gate.set()
        client.shutdown()


def test_mailbox_wakes_the_loop_once_per_burst_and_keeps_order():
    import threading

    from mlxcel.engine.client import Mailbox

    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))[1]
        box, got = Mailbox.of(loop), []
        assert Mailbox.of(loop) is box
        for i in range(100):  # a burst: nothing drains until this coroutine yields
            box.post(got.append, i)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got == list(range(100)) and len(wakeups) == 1
        t = threading.Thread(target=lambda: [box.post(got.append, i) for i in range(100, 150)])
        t.start()
        t.join()
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == list(range(150)) and len(wakeups) == 2

    asyncio.run(main())


def test_take_ready_returns_what_arrived_and_ends_with_the_finish(engine):
    async def main():
        stream = engine.submit(req("ready", max_tokens=6, ignore_eos=True))
        first = await stream.__anext__()
        for _ in range(1000):  # let the rest arrive unread
            if stream.buffered and stream._buffer[-1].finish_reason is not None:
                break
            await asyncio.sleep(0.01)
        rest = stream.take_ready()
        assert rest and rest[-1].finish_reason is not None and stream.done
        assert stream.take_ready() == []
        return [first, *rest]

    events = asyncio.run(main())
    assert sum(len(e.token_ids) for e in events) == 6


def test_the_switch_interval_setting_is_applied_by_the_engine(tiny_checkpoint):
    import sys

    from mlxcel.engine.config import EngineConfig

    before = sys.getswitchinterval()
    client = engine_for(tiny_checkpoint, 1, config=EngineConfig(switch_interval=0.0007))
    try:
        for _ in range(1000):
            if abs(sys.getswitchinterval() - 0.0007) < 1e-6:
                break
            time.sleep(0.01)
        assert abs(sys.getswitchinterval() - 0.0007) < 1e-6
    finally:
        client.shutdown()
        sys.setswitchinterval(before)
