"""Request-level faults: one request's inputs must never hurt another's, and every request
gets a complete answer in bounded time (real server, fixed counts, deadlines)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from conftest import assert_no_leak, rss_bytes

VICTIM = {"prompt": "victim stream", "max_tokens": 160, "temperature": 0, "ignore_eos": True,
          "stream": True}


async def _stream(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    """Reads one SSE response to its end: finish reason, chunk count, worst chunk gap."""
    out = {"status": None, "finish": None, "chunks": 0, "max_gap": 0.0, "error": None,
           "done": False}
    last = time.perf_counter()
    async with client.stream("POST", path, json=body) as resp:
        out["status"] = resp.status_code
        if resp.status_code != 200:
            out["error"] = json.loads(await resp.aread())["error"]
            return out
        async for line in resp.aiter_lines():
            now = time.perf_counter()
            out["max_gap"] = max(out["max_gap"], now - last)
            last = now
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                continue
            data = json.loads(line[6:])
            if "error" in data:
                out["error"] = data["error"]
                continue
            out["chunks"] += 1
            for choice in data.get("choices", []):
                out["finish"] = choice.get("finish_reason") or out["finish"]
    return out


def test_penalty_bomb_next_to_victim_streams(start_server):
    """A DRY bomb (a 1,300-token repeat, a huge dry_base) beside three streams: the
    streams run to their length, the bombs are answered, nothing fails in between."""
    srv = start_server("--parallel", "4")
    rss = rss_bytes(srv)

    async def scenario():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            victims = [asyncio.create_task(_stream(client, "/v1/completions", VICTIM))
                       for _ in range(3)]
            await asyncio.sleep(0.3)
            bombs = [
                {"prompt": [5] * 1300, "max_tokens": 5, "dry_multiplier": 0.8},
                {"prompt": [7, 8] * 700, "max_tokens": 5, "dry_multiplier": 1.0,
                 "dry_base": 1e300, "dry_allowed_length": 1},
                {"prompt": [9] * 600, "max_tokens": 5, "repetition_penalty": 1e-30,
                 "frequency_penalty": 2, "presence_penalty": -2, "temperature": 1e-30},
            ]
            answers = await asyncio.gather(*[client.post("/v1/completions", json=b)
                                             for b in bombs])
            return await asyncio.gather(*victims), answers

    victims, answers = asyncio.run(asyncio.wait_for(scenario(), 90))
    for resp in answers:
        assert resp.status_code in (200, 400), resp.text
        if resp.status_code == 200:
            assert resp.json()["choices"][0]["finish_reason"] in ("length", "stop")
        else:
            assert resp.json()["error"]["type"] == "invalid_request_error"
    for v in victims:
        assert v["status"] == 200 and v["error"] is None and v["done"], v
        assert v["finish"] == "length", v
    assert_no_leak(srv, rss)


def test_big_body_flood_while_streaming(start_server):
    """Eight ~9 MB bodies (chat prompts and /tokenize) while a stream runs: /health keeps
    answering in milliseconds, the stream never stalls, every big body gets its answer."""
    srv = start_server("--parallel", "2")
    rss = rss_bytes(srv)
    text = "lorem ipsum dolor sit amet " * (9_000_000 // 27)
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}

    async def poll_health(client, stop, samples):
        while not stop.is_set():
            t = time.perf_counter()
            resp = await client.get("/health")
            samples.append((time.perf_counter() - t, resp.status_code))
            await asyncio.sleep(0.05)

    async def scenario():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            victim = asyncio.create_task(_stream(client, "/v1/completions",
                                                 {**VICTIM, "max_tokens": 400}))
            stop, samples = asyncio.Event(), []
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as probe:
                poller = asyncio.create_task(poll_health(probe, stop, samples))
                await asyncio.sleep(0.2)
                t = time.perf_counter()
                big = await asyncio.gather(
                    *[client.post("/v1/chat/completions", json=chat) for _ in range(4)],
                    *[client.post("/tokenize", json={"content": text}) for _ in range(4)])
                elapsed = time.perf_counter() - t
                stop.set()
                await poller
            return await victim, big, samples, elapsed

    victim, big, samples, elapsed = asyncio.run(asyncio.wait_for(scenario(), 150))
    assert elapsed < 60, f"big bodies took {elapsed:.1f}s"
    for resp in big[:4]:
        assert resp.status_code == 400, resp.text[:300]
        assert resp.json()["error"]["code"] == "context_length_exceeded"
    for resp in big[4:]:
        assert resp.status_code in (200, 400), resp.text[:300]
    latencies = sorted(s for s, _ in samples)
    assert len(latencies) >= 5 and all(code == 200 for _, code in samples)
    assert latencies[len(latencies) // 2] < 0.1, latencies
    assert latencies[-1] < 1.0, latencies[-5:]
    assert victim["done"] and victim["finish"] == "length" and victim["max_gap"] < 2.0, victim
    assert_no_leak(srv, rss)


BAD_INPUTS = [
    b"{not json",
    b'{"messages": "hello"}',
    b'{"messages": [{"role": "wizard", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}',
    b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}',
    b'{"messages": [{"role": "user", "content": "x"}], "dry_base": 0.5}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
    b'{"messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b'{"prompt": [99999999], "max_tokens": 3}',
]


async def _mixed_one(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    """One request of the mix; returns its kind and outcome, asserting its invariant."""
    kind = i % 5
    chat = {"messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": 24,
            "temperature": rng.choice([0, 0.8]), "ignore_eos": True}
    if kind == 0:
        out = await _stream(client, "/v1/chat/completions", {**chat, "stream": True})
        if out["status"] == 503:
            return "busy"
        assert out["status"] == 200 and out["done"] and out["finish"] == "length", out
        return "stream"
    if kind == 1:
        resp = await client.post("/v1/completions", json={"prompt": f"p{i}", "max_tokens": 24,
                                                          "ignore_eos": True})
        if resp.status_code == 503:
            return "busy"
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 24
        return "whole"
    if kind in (2, 3):  # cancelled: streamed or not, the client leaves early
        body = {**chat, "max_tokens": 4000, "stream": kind == 2}
        try:
            await asyncio.wait_for(client.post("/v1/chat/completions", json=body),
                                   rng.uniform(0.1, 0.5))
        except asyncio.TimeoutError:
            return "cancelled"
        return "finished-before-cancel"
    payload = BAD_INPUTS[(i // 5) % len(BAD_INPUTS)]
    path = "/v1/completions" if b'"prompt"' in payload else "/v1/chat/completions"
    resp = await client.post(path, content=payload,
                             headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, (payload[:80], resp.status_code, resp.text[:300])
    assert resp.json()["error"]["type"] == "invalid_request_error"
    return "bad"


def test_hundred_mixed_requests_at_parallel_4(start_server):
    """100 requests (streamed, whole, cancelled, bad) 16 at a time at --parallel 4 with room
    in the queue for all of them: every valid one completes (no 503, no 500, no hung
    stream), every bad one is a 400, and every slot is free afterwards."""
    # 16 in flight, plus room for cancelled ones the engine has not yet reaped between steps
    srv = start_server("--parallel", "4", "--max-queue-depth", "24")
    rss = rss_bytes(srv)
    rng = random.Random(12)

    async def scenario():
        gate = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60,
                                     limits=httpx.Limits(max_connections=32)) as client:
            async def run(i):
                async with gate:
                    return await _mixed_one(client, i, rng)

            return await asyncio.gather(*[run(i) for i in range(100)])

    outcomes = asyncio.run(asyncio.wait_for(scenario(), 240))
    assert outcomes.count("bad") == 20
    assert outcomes.count("stream") == 20 and outcomes.count("whole") == 20, outcomes
    assert outcomes.count("cancelled") + outcomes.count("finished-before-cancel") == 40
    assert_no_leak(srv, rss)
    text = httpx.get(srv.base_url + "/metrics").text
    assert "mlxcel_requests_total" in text
