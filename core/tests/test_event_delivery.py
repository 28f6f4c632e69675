"""Engine events reach the asyncio side with one loop wake-up per engine step (and one
more in a step where prefilled rows join: their first tokens go out before the step's
decode work)."""

from __future__ import annotations

import asyncio
import threading
import time

from mlxcel.engine.client import EngineClient, HeldWakeups, Mailbox
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.types import GenerationRequest, SamplingParams


def _count_wakeups(loop: asyncio.AbstractEventLoop) -> list[int]:
    wakeups: list[int] = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))[1]
    return wakeups


def test_held_posts_wake_the_loop_once_per_flush_and_keep_order():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = _count_wakeups(loop)
        box, got, seen = Mailbox.of(loop), [], {}

        def engine_step():
            with HeldWakeups() as held:
                for i in range(100):
                    box.post(got.append, i)
                seen["before_flush"] = len(wakeups)
                held.flush()
                seen["after_flush"] = len(wakeups)
                while len(got) < 100:  # drained: the next posts need a wake-up of their own
                    time.sleep(0.001)
                for i in range(100, 150):
                    box.post(got.append, i)
                seen["before_exit"] = len(wakeups)

        t = threading.Thread(target=engine_step)
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.001)
        for _ in range(3):
            await asyncio.sleep(0)
        assert seen == {"before_flush": 0, "after_flush": 1, "before_exit": 1}
        assert len(wakeups) == 2 and got == list(range(150))
        box.post(got.append, 150)  # not held (this thread holds nothing): at once
        await asyncio.sleep(0)
        assert len(wakeups) == 3 and got[-1] == 150

    asyncio.run(main())


def test_held_posts_to_a_closed_loop_tell_their_senders():
    loop = asyncio.new_event_loop()
    box = Mailbox.of(loop)
    loop.close()
    lost: list[int] = []
    with HeldWakeups():  # the flush at the end must not raise into the engine
        for i in range(3):
            box.post(print, i, lambda i=i: lost.append(i))
    assert lost == [0, 1, 2]


def test_the_engine_wakes_the_loop_at_most_once_per_iteration(tiny_checkpoint):
    families = load_plugins().families
    client = EngineClient(lambda: load_checkpoint(str(tiny_checkpoint), families), parallel=4)
    client.start()
    client.worker.ready.wait(60)
    iterations: list[int] = []
    real = client.worker.step
    client.worker.step = lambda: (iterations.append(1), real())[1]
    joins: list[int] = []  # a join hands its rows' first tokens out at once, then steps
    join = client.worker._join_prefilled
    client.worker._join_prefilled = lambda: (joins.append(1), join())[1]

    async def main():
        wakeups = _count_wakeups(asyncio.get_running_loop())

        async def one(i):
            req = GenerationRequest(request_id=f"w{i}", prompt_tokens=(1, 2, 3, 4 + i),
                                    max_tokens=16, ignore_eos=True,
                                    sampling=SamplingParams(temperature=0.0))
            return [e async for e in client.submit(req)]

        streams = await asyncio.gather(*(one(i) for i in range(4)))
        return wakeups, streams

    try:
        wakeups, streams = asyncio.run(main())
    finally:
        client.shutdown()
    assert all(sum(len(e.token_ids) for e in events) == 16 for events in streams)
    events = sum(len(events) for events in streams)
    assert len(wakeups) <= len(iterations) + len(joins) and len(iterations) < events
