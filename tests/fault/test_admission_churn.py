"""Admission under churn: looping clients keep every slot turning over, and the queue of
requests waiting for a slot never grows past ``--max-queue-depth`` (the excess is 503)."""

from __future__ import annotations

import asyncio
import time

import httpx
from conftest import assert_no_leak, rss_bytes

CLIENTS = 60
DEPTH = 4
RUN_S = 6.0


async def _loop_client(http: httpx.AsyncClient, until: float, codes: list[int]) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        r = await http.post("/completion", json={"prompt": f"churn {n}", "n_predict": 2 + n % 3,
                                                 "temperature": 0})
        codes.append(r.status_code)
        if r.status_code == 503:
            await asyncio.sleep(0.005)


async def _sample_queue(base_url: str, until: float, seen: list[int]) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        while time.monotonic() < until:
            batch = (await http.get("/health")).json().get("batch", {})
            seen.append(batch.get("queue_depth", 0))


def test_queue_depth_holds_under_looping_clients(start_server):
    srv = start_server("--parallel", "2", "--max-queue-depth", str(DEPTH))
    rss = rss_bytes(srv)
    codes: list[int] = []
    seen: list[int] = []

    async def run() -> None:
        limits = httpx.Limits(max_connections=CLIENTS + 2)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30, limits=limits) as http:
            until = time.monotonic() + RUN_S
            await asyncio.wait_for(asyncio.gather(
                _sample_queue(srv.base_url, until, seen),
                *[_loop_client(http, until, codes) for _ in range(CLIENTS)]), timeout=40)
    asyncio.run(run())
    assert codes.count(200) > CLIENTS and codes.count(503) > 0, (codes.count(200),
                                                                 codes.count(503))
    assert set(codes) <= {200, 503}, sorted(set(codes))
    assert len(seen) > 20 and max(seen) <= DEPTH, (len(seen), max(seen))
    assert_no_leak(srv, rss)
