"""Failures no row can be blamed for: a step that raises fails the running batch and the
engine serves on; an engine thread that dies ends every open stream with an error and
refuses later submits."""

from __future__ import annotations

import asyncio

import pytest
from mlxcel.engine.client import EngineClient
from mlxcel.errors import GenerationFailed
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
DEADLINE_S = 30.0


class EngineKilled(BaseException):
    """Not an Exception: nothing in the step loop may catch it."""


def bombed_loader(path, exc_type, after_calls):
    """The real checkpoint, its model's forward raising ``exc_type`` from call
    ``after_calls`` on (``once``: only that call)."""
    families = load_plugins().families
    calls = {"n": 0}

    def load():
        ckpt = load_checkpoint(str(path), families)
        real = type(ckpt.model)

        def forward(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == after_calls or (exc_type is EngineKilled
                                              and calls["n"] > after_calls):
                raise exc_type("the device went away")
            return real.__call__(self, *args, **kwargs)

        ckpt.model.__class__ = type("Bombed" + real.__name__, (real,), {"__call__": forward})
        return ckpt

    return load, calls


def req(rid, prompt, max_tokens=40):
    return GenerationRequest(request_id=rid, prompt_tokens=tuple(prompt), max_tokens=max_tokens,
                             sampling=GREEDY, ignore_eos=True)


async def collect(stream):
    return [e async for e in stream]


def started(path, exc_type, after_calls):
    load, calls = bombed_loader(path, exc_type, after_calls)
    client = EngineClient(load, parallel=4)
    client.start()
    assert client.worker.ready.wait(60)
    calls["n"] = 0  # count from the first request on (setup may run the model)
    return client


def test_engine_thread_death_ends_every_stream_and_refuses_submits(tiny_checkpoint):
    client = started(tiny_checkpoint, EngineKilled, after_calls=12)

    async def scenario():
        streams = [client.submit(req(f"s{i}", [3 + i, 4, 5, 6])) for i in range(6)]
        results = await asyncio.wait_for(
            asyncio.gather(*(collect(s) for s in streams)), DEADLINE_S)
        with pytest.raises(GenerationFailed, match="engine stopped"):
            client.submit(req("late", [1, 2, 3]))
        return results

    try:
        results = asyncio.run(scenario())
        client.worker.join(DEADLINE_S)
        assert not client.worker.is_alive()
        assert client.worker.state == "failed"
        assert "EngineKilled" in client.worker.error
        for events in results:  # decoding and still-waiting requests alike
            assert events[-1].finish_reason == "error"
            assert events[-1].error.startswith("engine stopped:")
    finally:
        client.shutdown()


def test_a_failed_step_fails_the_batch_and_the_engine_serves_on(tiny_checkpoint):
    client = started(tiny_checkpoint, RuntimeError, after_calls=6)

    async def scenario():
        first = [client.submit(req(f"a{i}", [3 + i, 4, 5])) for i in range(2)]
        failed = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in first)),
                                        DEADLINE_S)
        again = await asyncio.wait_for(collect(client.submit(req("b", [3, 4, 5], 8))),
                                       DEADLINE_S)
        return failed, again

    try:
        failed, again = asyncio.run(scenario())
        assert [e[-1].finish_reason for e in failed] == ["error", "error"]
        assert all("engine error" in e[-1].error for e in failed)
        assert again[-1].finish_reason == "length"
        assert sum(len(e.token_ids) for e in again) == 8
        assert client.worker.state == "ready" and client.worker.is_alive()
        assert not client.worker.active and client.worker.queued == 0
    finally:
        client.shutdown()
    assert client.worker.state == "stopped"
    with pytest.raises(GenerationFailed):
        asyncio.run(_submit_late(client))


async def _submit_late(client):
    client.submit(req("after", [1, 2]))
