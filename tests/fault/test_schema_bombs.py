"""Schema bombs (issue #27 H1/M1): a 40-byte schema once made the grammar build allocate
until the worker was OOM-killed, and two slow schemas disabled structured output until a
restart. Through all three dialects, beside a running stream: every bomb is answered in
its dialect's error shape within seconds, the server's memory stays bounded, the stream
keeps flowing, and a plain schema still compiles afterwards."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from conftest import assert_no_leak, rss_bytes

VICTIM = {"prompt": "victim stream", "max_tokens": 120, "temperature": 0, "ignore_eos": True,
          "stream": True}
TINY_BOMB = {"type": "string", "maxLength": 1_000_000_000}
# every count under the bound, and still a build without end: 24 optional long strings
HEAVY_BOMB = {"type": "object", "properties": {
    f"p{i}": {"type": "string", "maxLength": 1024} for i in range(24)}}
USER = [{"role": "user", "content": "hi"}]


def _requests(schema: dict) -> list[tuple[str, dict]]:
    """The schema as OpenAI chat response_format, Responses text.format and an Anthropic
    forced tool's input_schema (tool_choice any)."""
    obj = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    return [
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "b", "schema": obj}}}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "text": {"format": {
            "type": "json_schema", "name": "b", "schema": obj}}}),
        ("/v1/messages", {"model": "tiny", "messages": USER, "max_tokens": 8,
                          "tools": [{"name": "f", "input_schema": obj}],
                          "tool_choice": {"type": "any"}}),
    ]


async def _victim(client: httpx.AsyncClient) -> dict:
    out = {"status": None, "max_gap": 0.0, "chunks": 0, "done": False}
    last = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=VICTIM) as resp:
        out["status"] = resp.status_code
        async for line in resp.aiter_lines():
            now = time.perf_counter()
            out["max_gap"], last = max(out["max_gap"], now - last), now
            out["done"] |= line == "data: [DONE]"
            out["chunks"] += line.startswith("data: {")
    return out


class _Peak:
    """Samples the server's summed RSS (its processes and compile workers) meanwhile."""

    def __init__(self, srv) -> None:
        self.srv, self.peak, self._stop = srv, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.srv))
            time.sleep(0.1)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _error(path: str, resp: httpx.Response) -> dict:
    body = resp.json()
    if path == "/v1/messages":
        assert body["type"] == "error", body
    return body["error"]


def _scenario(srv, schema: dict) -> tuple[dict, list[tuple[str, httpx.Response, float]]]:
    async def run():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=40) as client:
            victim = asyncio.create_task(_victim(client))
            await asyncio.sleep(0.3)

            async def one(path: str, body: dict):
                started = time.monotonic()
                resp = await client.post(path, json=body)
                return path, resp, time.monotonic() - started

            answers = await asyncio.gather(*[one(p, b) for p, b in _requests(schema)])
            return await victim, answers

    return asyncio.run(asyncio.wait_for(run(), 50))


def test_a_tiny_count_bomb_is_refused_at_once_in_every_dialect(start_server):
    """{"maxLength": 1e9}: 400 naming the keyword, before anything is built."""
    srv = start_server("--parallel", "2")
    rss = rss_bytes(srv)
    with _Peak(srv) as peak:
        victim, answers = _scenario(srv, TINY_BOMB)
    for path, resp, took in answers:
        assert resp.status_code == 400, (path, resp.text)
        error = _error(path, resp)
        assert error["type"] == "invalid_request_error" and "`maxLength`" in error["message"]
        assert "1000000000" not in error["message"] and took < 5, (path, took)
    assert victim["status"] == 200 and victim["done"] and victim["chunks"] >= 120, victim
    assert peak.peak - rss < 256 << 20, f"RSS rose by {(peak.peak - rss) >> 20} MiB"
    assert_no_leak(srv, rss)


def test_heavy_bombs_are_stopped_and_structured_output_still_works(start_server):
    """Schemas that pass every count check but build without end: each is stopped at the
    timeout or the compile memory cap (400, not a hung or dead server), the slots come
    back, and a plain schema compiles right after in each dialect."""
    srv = start_server("--parallel", "2", "--grammar-compile-timeout", "4",
                       "--grammar-compile-memory", "1G")
    rss = rss_bytes(srv)
    with _Peak(srv) as peak:
        victim, answers = _scenario(srv, HEAVY_BOMB)
    for path, resp, took in answers:
        assert resp.status_code in (400, 503), (path, resp.text)
        error = _error(path, resp)
        if resp.status_code == 400:
            assert "compile" in error["message"], error
        assert took < 20, (path, took)
    assert victim["status"] == 200 and victim["done"] and victim["chunks"] >= 120, victim
    assert victim["max_gap"] < 2.0, victim
    # two compile workers of at most 1 GiB each, plus what the server itself may grow
    assert peak.peak - rss < (2 << 30) + (512 << 20), f"RSS peak +{(peak.peak - rss) >> 20} MiB"
    with httpx.Client(base_url=srv.base_url, timeout=30) as client:
        for path, body in _requests({"type": "integer"}):
            resp = client.post(path, json=body)
            assert resp.status_code == 200, (path, resp.text)
    assert_no_leak(srv, rss)
