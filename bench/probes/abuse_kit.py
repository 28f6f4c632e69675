"""What the abuse probe's scenarios share: a streaming client that records its gaps,
``/health`` sampling, percentiles, and the server's memory over its process tree with a
watchdog that kills a server past a cap (``bench/probes/abuse.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from typing import Any

import httpx
from mlxcel.testing.procs import rss_bytes
from mlxcel.testing.servers import Server

MIB = 1 << 20
RSS_CAP = 6 << 30  # a server past this is killed (the old schema build allocates on)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def health_samples(base: str, stop: asyncio.Event, out: list[float]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=10, trust_env=False) as client:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                await client.get("/health")
                out.append((time.perf_counter() - t) * 1000)
            except httpx.HTTPError:
                out.append(10_000.0)
            await asyncio.sleep(0.05)


async def stream(client: httpx.AsyncClient, name: str, prompt: str, max_tokens: int,
                 rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A streamed chat request timed per content chunk, recorded into ``rec`` as it goes
    (pass one to read what a stream cut short by a timeout had got)."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if name != "mlx_lm":
        body["ignore_eos"] = True
    rec = rec if rec is not None else {}
    rec.update(chunks=0, gaps=[], ok=False)
    t0 = last = rec["last"] = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            rec["status"] = resp.status_code
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                if line == "data: [DONE]":
                    rec["ok"] = resp.status_code == 200 and "error" not in rec
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    rec["error"] = data["error"].get("message")
                    continue
                for choice in data.get("choices", []):
                    if (choice.get("delta") or {}).get("content"):
                        if rec["chunks"]:
                            rec["gaps"].append(now - last)
                        else:
                            rec["ttft"] = now - t0
                        rec["chunks"] += 1
                        last = rec["last"] = now
                    if choice.get("finish_reason"):
                        rec["finish"] = choice["finish_reason"]
    except httpx.HTTPError as exc:
        rec["error"] = type(exc).__name__
    rec["decode_s"] = sum(rec["gaps"])
    return rec


def summary(samples: list[float]) -> dict[str, Any]:
    return {"n": len(samples), "p50_ms": pct(samples, 0.5), "p99_ms": pct(samples, 0.99),
            "max_ms": max(samples) if samples else None}


class RssWatch:
    """Samples the server's RSS every 0.1 s in a thread: the peak, and past ``cap`` kills
    the server's process group and notes when (seconds since ``mark()``)."""

    def __init__(self, srv: Server, cap: int) -> None:
        self.srv, self.cap, self.peak, self.killed_after_s = srv, cap, 0, None
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def mark(self) -> None:
        self.t0 = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.is_set() and self.srv.alive():
            rss = rss_bytes(self.srv)
            self.peak = max(self.peak, rss)
            if rss > self.cap:
                self.killed_after_s = round(time.perf_counter() - self.t0, 1)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.srv.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def timed_post(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                     timeout: float) -> tuple[int | str, float]:
    t = time.perf_counter()
    try:
        status: int | str = (await client.post(path, json=body, timeout=timeout)).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, round(time.perf_counter() - t, 2)


async def finished(task: asyncio.Task, timeout: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(task, max(timeout, 0.1))
    except asyncio.TimeoutError:
        return {"ok": False, "gaps": [], "error": "timeout"}
