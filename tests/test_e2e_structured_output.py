"""Structured output through the real ``mlxcel-server``: every schema of the corpus holds
on the tiny random-weight model, streamed and not, with the requests batched together;
a compile over ``--grammar-compile-timeout`` is a 400 while another stream keeps flowing."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
import uuid

import httpx
import jsonschema
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow

CORPUS = json.loads((pathlib.Path(__file__).parents[1] / "core" / "tests" / "data"
                     / "constraint_schemas.json").read_text(encoding="utf-8"))
FORMATS = jsonschema.FormatChecker(formats=("email", "uuid"))
# a random model may wander past max_tokens (a favourite token that never closes a string):
# the next attempt retries, hotter (nearer to a uniform walk over the allowed tokens)
ATTEMPTS = [(seed, temp) for temp in (1.0, 4.0, 16.0) for seed in (1, 2)]
USER = [{"role": "user", "content": "Give me the JSON."}]


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "16", "--max-queue-depth", "96"])
    yield srv
    srv.stop()


def body(schema, seed: int, stream: bool, temperature: float = 1.0) -> dict:
    return {"messages": USER, "max_tokens": 1500, "temperature": temperature, "seed": seed,
            "stream": stream, "response_format": {
                "type": "json_schema", "json_schema": {"name": "out", "schema": schema}}}


async def answer(client: httpx.AsyncClient, schema, seed: int, stream: bool, temp: float):
    r = await client.post("/v1/chat/completions", json=body(schema, seed, stream, temp))
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    text, finish = "", None
    for line in r.text.split("\n\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
    return text, finish


async def settled(client, case, stream: bool) -> tuple[str, int]:
    """The first answer that ended (``stop``) over the attempts, and how many ran out."""
    ran_out = 0
    for seed, temp in ATTEMPTS:
        text, finish = await answer(client, case["schema"], seed, stream, temp)
        if finish == "stop":
            return text, ran_out
        assert finish == "length"
        ran_out += 1
    raise AssertionError(f"{case['name']}: no attempt ended within max_tokens")


def test_every_corpus_schema_holds_streamed_and_not(server):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            jobs = [settled(client, case, stream) for case in CORPUS for stream in (False, True)]
            return await asyncio.gather(*jobs)

    results = asyncio.run(scenario())
    cases = [(case, stream) for case in CORPUS for stream in (False, True)]
    for (case, stream), (text, _) in zip(cases, results, strict=True):
        try:
            jsonschema.validate(json.loads(text), case["schema"], format_checker=FORMATS)
        except (ValueError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"{case['name']} (stream={stream}): {text!r}: {exc}") from None
    assert sum(n == 0 for _, n in results) >= len(results) // 2  # most end at once


def test_a_compile_over_the_timeout_is_a_400_while_a_stream_flows(tiny_checkpoint):
    # a free-form object compiles for seconds; the cap is far below that. A fresh name
    # per run: a compile that outlives its cap still finishes and is cached on disk
    srv = Server(["--model", str(tiny_checkpoint), "--grammar-compile-timeout", "0.05"])
    run = uuid.uuid4().hex[:8]
    heavy = {"type": "object", "properties": {
        f"k{i}_{run}": {"type": "array", "items": {"type": "object"}} for i in range(4)}}

    async def scenario():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            times: list[float] = []

            async def stream():
                payload = {"messages": USER, "max_tokens": 400, "stream": True,
                           "ignore_eos": True, "temperature": 0}
                async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
                    async for _ in r.aiter_lines():
                        times.append(time.monotonic())

            flowing = asyncio.create_task(stream())
            while not times:
                await asyncio.sleep(0.01)
            sent = time.monotonic()
            refused = await client.post("/v1/chat/completions", json=body(heavy, 1, False))
            answered = time.monotonic()
            await flowing
            return refused, sent, answered, times

    try:
        refused, sent, answered, times = asyncio.run(scenario())
    finally:
        srv.stop()
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and run not in error["message"]
    assert "compile" in error["message"]
    assert any(sent < t < answered for t in times) or answered - sent < 0.2
