"""The abuse probe's round-two scenarios (issue #27): a schema memory bomb, Responses
store growth, admission under churn and streams whose clients never read
(``bench/probes/abuse.py`` runs them, one fresh server each)."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from typing import Any

import httpx
from abuse_kit import MIB, RSS_CAP, RssWatch, finished, rss_bytes, stream, timed_post
from mlxcel.testing.servers import HOST, Server

SCHEMA_BOMB = {"type": "object", "required": ["s"],
               "properties": {"s": {"type": "string", "maxLength": 1_000_000_000}}}


def schema_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "fill it in"}], "max_tokens": 8,
            "temperature": 0, "response_format": {
                "type": "json_schema", "json_schema": {"name": "b", "schema": schema}}}


async def schema_bomb(srv: Server, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_idle_mib": rss_bytes(srv) / MIB}
    with RssWatch(srv, RSS_CAP) as watch:
        async with httpx.AsyncClient(base_url=srv.base, timeout=60, trust_env=False) as c:
            vic: dict[str, Any] = {}
            victim = asyncio.create_task(stream(c, name, "victim", 2000, vic))
            await asyncio.sleep(0.3)
            watch.mark()
            answers = await asyncio.gather(*[timed_post(
                c, "/v1/chat/completions", schema_body(SCHEMA_BOMB), 30) for _ in range(3)])
            out["statuses"] = [a[0] for a in answers]
            out["answered_s"] = max(a[1] for a in answers)
            out["rss_at_answers_mib"] = rss_bytes(srv) / MIB
            await asyncio.sleep(10)
            out["rss_10s_later_mib"] = rss_bytes(srv) / MIB
            out["followup"] = (await timed_post(c, "/v1/chat/completions", schema_body(
                {"type": "integer"}), 12))[0] if srv.alive() else "server gone"
            done = await finished(victim, 5)
    stalled = time.perf_counter() - vic["last"] if "timeout" == done.get("error") else 0
    out.update(rss_peak_mib=watch.peak / MIB, killed_after_s=watch.killed_after_s,
               victim_ok=vic["ok"], victim_error=done.get("error"), victim_chunks=vic["chunks"],
               victim_max_gap_ms=max([*vic["gaps"], stalled]) * 1000)
    return out


STORE_JUNK = "j" * (4 << 20)


def store_turn(previous: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_output_tokens": 2, "temperature": 0, "store": True, "input": [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": STORE_JUNK}]},
        {"role": "user", "content": "Hi", "junk": STORE_JUNK}]}
    if previous:
        body["previous_response_id"] = previous
    return body


async def store_growth(srv: Server, name: str, turns: int = 20) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_idle_mib": rss_bytes(srv) / MIB, "statuses": []}
    previous, took, start = None, [], time.perf_counter()
    async with httpx.AsyncClient(base_url=srv.base, timeout=30, trust_env=False) as client:
        for i in range(turns):
            if time.perf_counter() - start > 50:
                break
            t = time.perf_counter()
            resp = await client.post("/v1/responses", json=store_turn(previous))
            took.append(time.perf_counter() - t)
            out["statuses"].append(resp.status_code)
            previous = resp.json().get("id") if resp.status_code == 200 else previous
            if i == 0:  # the allocator has seen an 8 MB body
                out["rss_turn1_mib"] = rss_bytes(srv) / MIB
    out.update(turns=len(took), turn_p50_s=statistics.median(took),
               rss_end_mib=rss_bytes(srv) / MIB, body_mb=len(json.dumps(store_turn("x"))) / 1e6)
    out["growth_mib"] = out["rss_end_mib"] - out["rss_turn1_mib"]
    return out


async def churn_client(client: httpx.AsyncClient, until: float, codes: list[Any]) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            resp = await client.post("/v1/completions", json={
                "prompt": f"churn {n}", "max_tokens": 4, "temperature": 0})
            codes.append(resp.status_code)
        except httpx.HTTPError as exc:
            codes.append(type(exc).__name__)
        if codes[-1] != 200:
            await asyncio.sleep(0.005)


async def queue_samples(base: str, until: float, seen: list[int]) -> None:
    """``/health``'s ``batch.queue_depth`` until ``until`` (nothing where it has none)."""
    async with httpx.AsyncClient(base_url=base, timeout=10, trust_env=False) as client:
        while time.monotonic() < until:
            batch = (await client.get("/health")).json().get("batch")
            if batch is None:
                return
            seen.append(batch.get("queue_depth", 0))
            await asyncio.sleep(0.01)


async def queue_churn(srv: Server, name: str, clients: int = 60, run_s: float = 6.0
                      ) -> dict[str, Any]:
    codes: list[Any] = []
    seen: list[int] = []
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=srv.base, timeout=30, limits=limits,
                                 trust_env=False) as client:
        until = time.monotonic() + run_s
        await asyncio.wait_for(asyncio.gather(
            queue_samples(srv.base, until, seen),
            *[churn_client(client, until, codes) for _ in range(clients)]), timeout=50)
    return {"max_queued": max(seen) if seen else None, "samples": len(seen),
            "served": codes.count(200), "refused_503": codes.count(503),
            "other": len(codes) - codes.count(200) - codes.count(503),
            "other_kinds": sorted({str(c) for c in codes} - {"200", "503"}),
            "served_per_s": codes.count(200) / run_s}


def never_reading(srv: Server, name: str, max_tokens: int) -> socket.socket:
    """A streamed chat request sent on a socket that is never read from."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "go on"}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if name != "mlx_lm":
        body["ignore_eos"] = True
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.connect((HOST, srv.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


async def engine_state(client: httpx.AsyncClient) -> tuple[int | None, int | None]:
    """(decode tokens so far, active sequences) from ``/health``, where it has them."""
    health = (await client.get("/health")).json()
    return ((health.get("observability") or {}).get("total_decode_tokens"),
            (health.get("batch") or {}).get("active_sequences"))


async def idle_after(client: httpx.AsyncClient, since: float, until: float) -> float | None:
    """Seconds from ``since`` until ``/health`` shows no active sequence (None: not seen)."""
    while time.perf_counter() < until:
        _, active = await engine_state(client)
        if active is None:
            return None
        if active == 0:
            return round(time.perf_counter() - since, 2)
        await asyncio.sleep(0.1)
    return None


async def unread_streams(srv: Server, name: str, max_tokens: int = 6000) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=srv.base, timeout=50, trust_env=False) as client:
        before, _ = await engine_state(client)
        sent = time.perf_counter()
        socks = [never_reading(srv, name, max_tokens) for _ in range(2)]
        try:
            await asyncio.sleep(0.5)
            rec = await finished(asyncio.create_task(stream(client, name, "third", 8)), 45)
            idle = await idle_after(client, sent, sent + 55)
            after, _ = await engine_state(client)
        finally:
            for sock in socks:
                sock.close()
    unread = None if before is None or after is None \
        else after - before - rec.get("chunks", 0)
    return {"third_ttft_s": rec.get("ttft"), "third_ok": rec["ok"],
            "third_error": rec.get("error"), "unread_tokens": unread, "idle_after_s": idle,
            "max_tokens_each": max_tokens}
