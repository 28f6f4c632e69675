"""Admission control on the real server: 503 before any SSE byte, priorities, memory budget."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "1", "--max-queue-depth", "1",
                  "--slots"], env={"MLXCEL_REQUEST_MEMORY_BUDGET": "300K"})
    yield srv
    srv.stop()


def test_full_queue_gets_503_before_any_sse_header(server):
    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            long = {"messages": MSG, "stream": True, "max_tokens": 120, "ignore_eos": True}
            async with http.stream("POST", "/v1/chat/completions", json=long) as running:
                lines = running.aiter_lines()
                async for line in lines:
                    if '"content"' in line:
                        break
                queued = asyncio.create_task(http.post(
                    "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}))
                for _ in range(200):
                    slots = (await http.get("/slots")).json()
                    if any(s["state"] == "queued" for s in slots):
                        break
                    await asyncio.sleep(0.01)
                refused = await http.post("/v1/chat/completions",
                                          json={**long, "max_tokens": 5})
                async for _ in lines:
                    pass
            return refused, await queued
    refused, queued = asyncio.run(run())
    assert refused.status_code == 503
    assert refused.headers["content-type"].startswith("application/json")
    assert refused.json()["error"]["type"] == "server_busy"
    assert queued.status_code == 200


def test_bad_priority_header_is_400(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", headers={"X-Priority": "urgent"},
                   json={"messages": MSG, "max_tokens": 2})
    assert r.status_code == 400 and "X-Priority" in r.json()["error"]["message"]
    ok = httpx.post(server.base_url + "/v1/completions", headers={"X-Priority": "LOW"},
                    json={"prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200


def test_memory_budget_is_503_with_the_numbers_before_sse(server):
    r = httpx.post(server.base_url + "/v1/chat/completions",
                   json={"messages": MSG, "max_tokens": 3000, "stream": True})
    assert r.status_code == 503 and r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["type"] == err["code"] == "request_memory_budget_exceeded"
    assert err["budget_bytes"] == 300 << 10 and err["estimated_bytes"] > err["budget_bytes"]
    small = httpx.post(server.base_url + "/v1/chat/completions",
                       json={"messages": MSG, "max_tokens": 4})
    assert small.status_code == 200
