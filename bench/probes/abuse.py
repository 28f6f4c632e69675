"""Abuse scenarios, side by side: this mlxcel build, an earlier mlxcel commit and
``mlx_lm.server`` on the same checkpoint, one server at a time, a fresh one per scenario.

Per server and scenario it records what a neighbour of the abuser sees:

- ``health_idle``: ``/health`` latency with nothing running (the baseline);
- ``big_body``: four ~9 MB chat bodies at once while a victim stream runs: time until all
  four are answered (or the cap), their statuses, ``/health`` latency meanwhile, and the
  victim's worst gap between chunks;
- ``idle_sockets``: 1,100 TCP connections that send nothing: ``/health`` latency with them
  open, and how many the server has closed after ``--idle-wait`` seconds;
- ``dry_bomb``: three victim streams beside a 1,300-token DRY repeat: how many victims
  finished normally, and their decode tok/s relative to the same streams without the bomb;
- ``disconnect``: four non-streaming requests whose clients leave after 0.5 s: seconds until
  a follow-up request's first token (the slots must be free again).

``mlx_lm.server`` ignores the DRY fields and has no context check (a 9 MB prompt is
prefilled): its numbers show what a user switching servers gets, not the same work.

    python bench/probes/abuse.py --before 50a7539        # this tree vs that commit vs mlx_lm
    python bench/probes/abuse.py --servers mlxcel --scenarios big_body,dry_bomb

Results go to ``--out`` (JSON) and the markdown file next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
from mlxcel.testing.bench_checkpoints import bench_checkpoint
from mlxcel.testing.servers import HOST, Server, loadavg, machine, versions

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCENARIOS = ("health_idle", "big_body", "idle_sockets", "dry_bomb", "disconnect")
BIG_BODY_CAP_S = 60.0


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


async def stream(client: httpx.AsyncClient, name: str, prompt: str, max_tokens: int
                 ) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if name != "mlx_lm":
        body["ignore_eos"] = True
    rec: dict[str, Any] = {"chunks": 0, "gaps": [], "ok": False}
    t0 = last = time.perf_counter()
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
                        last = now
                    if choice.get("finish_reason"):
                        rec["finish"] = choice["finish_reason"]
    except httpx.HTTPError as exc:
        rec["error"] = type(exc).__name__
    rec["decode_s"] = sum(rec["gaps"])
    return rec


def summary(samples: list[float]) -> dict[str, Any]:
    return {"n": len(samples), "p50_ms": pct(samples, 0.5), "p99_ms": pct(samples, 0.99),
            "max_ms": max(samples) if samples else None}


async def health_idle(srv: Server, name: str) -> dict[str, Any]:
    stop, samples = asyncio.Event(), []
    task = asyncio.create_task(health_samples(srv.base, stop, samples))
    await asyncio.sleep(2.0)
    stop.set()
    await task
    return {"health": summary(samples)}


async def big_body(srv: Server, name: str) -> dict[str, Any]:
    text = "lorem ipsum dolor sit amet " * (9_000_000 // 27)
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    stop, samples = asyncio.Event(), []
    async with httpx.AsyncClient(base_url=srv.base, timeout=BIG_BODY_CAP_S,
                                 trust_env=False) as client:
        victim = asyncio.create_task(stream(client, name, "victim", 400))
        poller = asyncio.create_task(health_samples(srv.base, stop, samples))
        await asyncio.sleep(0.3)
        t = time.perf_counter()

        async def post() -> int | str:
            try:
                return (await client.post("/v1/chat/completions", json=body)).status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__

        statuses = await asyncio.gather(*[post() for _ in range(4)])
        answered = time.perf_counter() - t
        stop.set()
        await poller
        try:
            vic = await asyncio.wait_for(victim, 60)
        except asyncio.TimeoutError:
            vic = {"ok": False, "gaps": [], "error": "timeout"}
    return {"answered_s": answered, "statuses": statuses, "health": summary(samples),
            "victim_ok": vic["ok"], "victim_max_gap_ms": max(vic["gaps"], default=0) * 1000}


async def idle_sockets(srv: Server, name: str, wait_s: float) -> dict[str, Any]:
    socks = []
    for _ in range(1100):
        socks.append(socket.create_connection((HOST, srv.port)))
    stop, samples = asyncio.Event(), []
    task = asyncio.create_task(health_samples(srv.base, stop, samples))
    await asyncio.sleep(2.0)
    stop.set()
    await task
    await asyncio.sleep(wait_s)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            closed += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    return {"health": summary(samples), "closed_after_wait": closed, "wait_s": wait_s}


async def dry_bomb(srv: Server, name: str) -> dict[str, Any]:
    async def victims(with_bomb: bool) -> tuple[list[dict[str, Any]], Any]:
        async with httpx.AsyncClient(base_url=srv.base, timeout=120, trust_env=False) as c:
            runs = [asyncio.create_task(stream(c, name, f"victim {i}", 600)) for i in range(3)]
            bomb = None
            if with_bomb:
                await asyncio.sleep(0.1)
                resp = await c.post("/v1/completions", json={
                    "prompt": [5] * 1300, "max_tokens": 5, "dry_multiplier": 0.8})
                bomb = resp.status_code
                if bomb == 200:
                    bomb = f"200 {resp.json()['choices'][0]['finish_reason']}"
            return list(await asyncio.gather(*runs)), bomb

    clean, _ = await victims(False)
    bombed, bomb_status = await victims(True)

    def rate(recs: list[dict[str, Any]]) -> float | None:
        rates = [len(r["gaps"]) / r["decode_s"] for r in recs if r["decode_s"] > 0]
        return statistics.median(rates) if rates else None

    clean_rate, bombed_rate = rate(clean), rate(bombed)
    return {"bomb_status": bomb_status,
            "victims_ok": sum(r["ok"] and r.get("finish") == "length" for r in bombed),
            "victim_finish": [r.get("finish") for r in bombed],
            "victim_tok_s_clean": clean_rate, "victim_tok_s_bombed": bombed_rate,
            "victim_rate_ratio": bombed_rate / clean_rate if clean_rate and bombed_rate
            else None}


async def disconnect(srv: Server, name: str) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "leave early"}],
                            "max_tokens": 3000, "temperature": 0}
    if name != "mlx_lm":
        body["ignore_eos"] = True
    async with httpx.AsyncClient(base_url=srv.base, timeout=120, trust_env=False) as client:
        async def leave() -> None:
            try:
                await asyncio.wait_for(client.post("/v1/chat/completions", json=body), 0.5)
            except asyncio.TimeoutError:
                pass

        t = time.perf_counter()
        await asyncio.gather(*[leave() for _ in range(4)])
        rec = await stream(client, name, "after the leavers", 8)
    return {"followup_ttft_s": (time.perf_counter() - t - 0.5) if rec.get("ttft") is None
            else rec["ttft"] + 0.0, "followup_ok": rec["ok"]}


async def run_scenarios(srv: Server, name: str, scenarios: list[str], idle_wait: float
                        ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scen in scenarios:
        t = time.perf_counter()
        if not srv.alive():
            out[scen] = {"error": "server not running"}
            continue
        if scen == "idle_sockets":
            out[scen] = await idle_sockets(srv, name, idle_wait)
        else:
            out[scen] = await globals()[scen](srv, name)
        out[scen]["scenario_s"] = round(time.perf_counter() - t, 2)
        print(f"  {name} {scen}: {out[scen]}", flush=True)
    return out


def worktree(commit: str) -> pathlib.Path:
    """A checkout of ``commit`` whose core/src runs on this venv (PYTHONPATH)."""
    path = pathlib.Path(tempfile.gettempdir()) / f"mlxcel-{commit}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path),
                        commit], check=True, capture_output=True)
    return path


def servers(names: list[str], ckpt: pathlib.Path, before: str | None, idle_timeout: float
            ) -> list[tuple[str, list[str], str, dict[str, str] | None]]:
    base = [sys.executable, "-m", "mlxcel.cli", "--model", str(ckpt), "--parallel", "4"]
    out = []
    for name in names:
        if name == "mlxcel":
            out.append((name, [*base, "--idle-timeout", str(idle_timeout)], "/health", None))
        elif name == "mlxcel_before" and before:
            env = {**os.environ, "PYTHONPATH": str(worktree(before) / "core" / "src")}
            out.append((f"mlxcel@{before}", base, "/health", env))
        elif name == "mlx_lm":
            out.append((name, [sys.executable, "-m", "mlx_lm", "server", "--model", str(ckpt)],
                        "/v1/models", None))
    return out


def render(doc: dict[str, Any]) -> str:
    lines = ["# Abuse scenarios: what a neighbour of the abuser sees", "",
             f"{doc['when']}; {doc['machine']}; checkpoint {doc['checkpoint']}; "
             f"versions {doc['versions']}.", "",
             "| scenario | measure | " + " | ".join(doc["results"]) + " |",
             "|---|---|" + "---|" * len(doc["results"])]
    rows = [("health_idle", "/health p50 / max ms", lambda r: _ms(r["health"])),
            ("big_body", "4 x 9 MB answered in s (statuses)",
             lambda r: f"{r['answered_s']:.1f} ({', '.join(map(str, r['statuses']))})"),
            ("big_body", "/health p50 / max ms meanwhile", lambda r: _ms(r["health"])),
            ("big_body", "victim stream ok, worst gap ms",
             lambda r: f"{r['victim_ok']}, {r['victim_max_gap_ms']:.0f}"),
            ("idle_sockets", "/health p50 / max ms, 1,100 idle sockets",
             lambda r: _ms(r["health"])),
            ("idle_sockets", "idle sockets closed by the server",
             lambda r: f"{r['closed_after_wait']} / 1100 after {r['wait_s']:.0f} s"),
            ("dry_bomb", "victims that ran to their length / 3 (bomb status)",
             lambda r: f"{r['victim_finish'].count('length')} ({r['bomb_status']})"),
            ("dry_bomb", "victim tok/s bombed / clean",
             lambda r: _ratio(r["victim_rate_ratio"])),
            ("disconnect", "follow-up TTFT s after 4 leavers",
             lambda r: f"{r['followup_ttft_s']:.2f} ({'ok' if r['followup_ok'] else 'failed'})")]
    for scen, label, cell in rows:
        cells = []
        for res in doc["results"].values():
            r = res.get(scen)
            try:
                cells.append(cell(r) if r and "error" not in r else (r or {}).get("error", "-"))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {scen} | {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Reproduce: `{doc['reproduce']}`", ""]
    return "\n".join(lines)


def _ms(h: dict[str, Any]) -> str:
    if not h.get("n"):
        return "-"
    if h["max_ms"] >= 10_000:  # health_samples' mark for a request that got no answer
        return f"no answer in 10 s ({h['n']} tried)"
    return f"{h['p50_ms']:.1f} / {h['max_ms']:.0f}"


def _ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="mlxcel,mlxcel_before,mlx_lm")
    ap.add_argument("--before", default=None, help="earlier mlxcel commit to compare")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--idle-timeout", type=float, default=5.0)
    ap.add_argument("--idle-wait", type=float, default=8.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "abuse.json"))
    args = ap.parse_args(argv)
    ckpt = bench_checkpoint("qwen3")
    scenarios = [s for s in args.scenarios.split(",") if s]
    results: dict[str, Any] = {}
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="abuse-"))
    for name, cmd, ready, env in servers(args.servers.split(","), ckpt, args.before,
                                         args.idle_timeout):
        results[name] = {}
        for scen in scenarios:  # a fresh server per scenario: no scenario's backlog leaks
            srv = Server(name, cmd, ready, logdir, f"abuse-{scen}", env=env, cwd=ROOT)
            srv.start()
            try:
                srv.wait_ready()
                results[name].update(asyncio.run(run_scenarios(srv, name, [scen],
                                                               args.idle_wait)))
            finally:
                srv.stop()
    doc = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{machine()['nproc']} CPUs ({machine()['cpu']}), 1-min load {loadavg()}",
           "checkpoint": ckpt.name, "versions": versions(), "results": results,
           "reproduce": "python bench/probes/abuse.py " + " ".join(argv or sys.argv[1:])}
    out = pathlib.Path(args.out)
    if out.exists():  # a re-run replaces the scenarios it ran, keeps the others
        old = json.loads(out.read_text()).get("results", {})
        for name, res in results.items():
            old[name] = {**old.get(name, {}), **res}
        doc["results"] = old
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(render(doc))
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
