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

Round two (issue #27; ``abuse_round2.{json,md}``), RSS summed over the server's process tree:

- ``schema_bomb``: three chat requests at once whose ``response_format`` schema holds a
  ``maxLength`` of 1e9, beside a victim stream: their statuses and time, RSS at the answers
  and 10 s later, the victim's worst gap, and a follow-up ``{"type": "integer"}`` schema's
  status; a server past ``RSS_CAP`` is killed (``killed_after_s``);
- ``store_growth``: 20 Responses turns (``store: true``, chained by
  ``previous_response_id``) each carrying a 4 MB unrendered ``reasoning`` item and a 4 MB
  unknown key: RSS growth from turn 1 to turn 20;
- ``queue_churn``: ``--parallel 2 --max-queue-depth 4``, 60 looping clients for 6 s of
  4-token completions: the deepest queue ``/health`` showed, and the 200s and 503s;
- ``unread_streams``: ``--parallel 2 --timeout 2``: two 6,000-token streams whose clients
  never read, then a third request: seconds to its first token, and the tokens generated
  for the unread two (``/health`` observability).

``mlx_lm.server`` has no schema or Responses store (those two are n/a there); it gets
``--decode-concurrency 2`` where mlxcel gets ``--parallel 2``, and has no queue bound or
write timeout.

``mlx_lm.server`` ignores the DRY fields and has no context check (a 9 MB prompt is
prefilled): its numbers show what a user switching servers gets, not the same work.

    python bench/probes/abuse.py --before 50a7539        # this tree vs that commit vs mlx_lm
    python bench/probes/abuse.py --servers mlxcel --scenarios big_body,dry_bomb
    python bench/probes/abuse.py --before c3a8a52 --out bench/results/abuse_round2.json \
        --scenarios schema_bomb,store_growth,queue_churn,unread_streams

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
from abuse_kit import MIB, RSS_CAP, health_samples, stream, summary
from abuse_round2 import queue_churn, schema_bomb, store_growth, unread_streams  # noqa: F401
from mlxcel.testing.bench_checkpoints import bench_checkpoint
from mlxcel.testing.servers import HOST, Server, loadavg, machine, versions

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCENARIOS = ("health_idle", "big_body", "idle_sockets", "dry_bomb", "disconnect",
             "schema_bomb", "store_growth", "queue_churn", "unread_streams")
BIG_BODY_CAP_S = 60.0
NOT_ON_MLX_LM = {"schema_bomb": "no json_schema response_format",
                 "store_growth": "no Responses store"}
MLXCEL_ARGS = {"queue_churn": ["--parallel", "2", "--max-queue-depth", "4"],
               "unread_streams": ["--parallel", "2", "--timeout", "2", "--ctx-size", "16384"]}
MLX_LM_ARGS = {"queue_churn": ["--decode-concurrency", "2"],
               "unread_streams": ["--decode-concurrency", "2"]}
# large frees go back to the OS at once, so RSS shows what is kept, not the allocator
SCENARIO_ENV = {"store_growth": {"MALLOC_MMAP_THRESHOLD_": str(MIB)}}


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
        try:
            if scen == "idle_sockets":
                out[scen] = await idle_sockets(srv, name, idle_wait)
            else:
                out[scen] = await globals()[scen](srv, name)
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            out[scen] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
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
    base = [sys.executable, "-m", "mlxcel.cli", "--model", str(ckpt)]
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


def run_one(name: str, cmd: list[str], ready: str, env: dict[str, str] | None, scen: str,
            logdir: pathlib.Path, idle_wait: float) -> dict[str, Any]:
    """One scenario on a fresh server with that scenario's flags and environment."""
    if name == "mlx_lm":
        if scen in NOT_ON_MLX_LM:
            return {scen: {"n/a": NOT_ON_MLX_LM[scen]}}
        extra = MLX_LM_ARGS.get(scen, [])
    else:
        extra = MLXCEL_ARGS.get(scen, ["--parallel", "4"])
    env = {**(env or os.environ), **SCENARIO_ENV.get(scen, {})}
    srv = Server(name, [*cmd, *extra], ready, logdir, f"abuse-{scen}", env=env, cwd=ROOT)
    srv.start()
    try:
        srv.wait_ready()
        return asyncio.run(run_scenarios(srv, name, [scen], idle_wait))
    finally:
        srv.stop()


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _bomb_rss(r: dict[str, Any]) -> str:
    if r["killed_after_s"] is not None:
        return f"killed at {RSS_CAP >> 30} GiB after {r['killed_after_s']:.1f} s"
    return f"{r['rss_at_answers_mib']:.0f} / {r['rss_10s_later_mib']:.0f}"


def _cell(r: dict[str, Any] | None, cell: Any, first: bool) -> str:
    if not r:
        return "-"
    if "n/a" in r:
        return f"n/a ({r['n/a']})" if first else "n/a"
    if "error" in r:
        return str(r["error"])
    try:
        return cell(r)
    except (KeyError, TypeError):
        return "-"


def _this_before(doc: dict[str, Any], scen: str, value: Any) -> str:
    """``this / before`` of a row's number, where both builds have it."""
    before = next((k for k in doc["results"] if k.startswith("mlxcel@")), None)
    if value is None or before is None:
        return ""
    try:
        a, b = value(doc["results"]["mlxcel"][scen]), value(doc["results"][before][scen])
        return f"{a / b:.2g}x" if b else "-"
    except (KeyError, TypeError, ZeroDivisionError):
        return "-"


def render(doc: dict[str, Any]) -> str:
    names = list(doc["results"])
    ran = [s for s in SCENARIOS if any(s in res for res in doc["results"].values())]
    lines = ["# Abuse scenarios: what a neighbour of the abuser sees", "",
             f"Command: `{doc['reproduce']}`", "",
             f"{doc['when']}; {doc['machine']}; checkpoint {doc['checkpoint']}; "
             f"versions {doc['versions']}.", ""]
    for scen in ran:
        lines += [f"## {scen}", "", "| measure | " + " | ".join(names) + " | this / before |",
                  "|---|" + "---|" * (len(names) + 1)]
        for i, (_, label, cell, value) in enumerate(row for row in ROWS if row[0] == scen):
            cells = [_cell(res.get(scen), cell, i == 0) for res in doc["results"].values()]
            lines.append(f"| {label} | " + " | ".join(cells)
                         + f" | {_this_before(doc, scen, value)} |")
        lines.append("")
    return "\n".join(lines)


def _ms(h: dict[str, Any]) -> str:
    if not h.get("n"):
        return "-"
    if h["max_ms"] >= 10_000:  # health_samples' mark for a request that got no answer
        return f"no answer in 10 s ({h['n']} tried)"
    return f"{h['p50_ms']:.1f} / {h['max_ms']:.0f}"


def _ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"



def _health(r: dict[str, Any]) -> str:
    return _ms(r["health"])


def _victim(r: dict[str, Any]) -> str:
    """A victim stream's cell: whether it ended well, and its worst gap in ms."""
    return f"{r['victim_ok']}, {r['victim_max_gap_ms']:.0f}"


# (scenario, measure, cell, the number a ratio this / before is taken of, or None)
ROWS: list[tuple[str, str, Any, Any]] = [
    ("health_idle", "/health p50 / max ms", _health, lambda r: r["health"]["p50_ms"]),
    ("big_body", "4 x 9 MB answered in s (statuses)",
     lambda r: f"{r['answered_s']:.1f} ({', '.join(map(str, r['statuses']))})",
     lambda r: r["answered_s"]),
    ("big_body", "/health p50 / max ms meanwhile", _health, None),
    ("big_body", "victim stream ok, worst gap ms", _victim, None),
    ("idle_sockets", "/health p50 / max ms, 1,100 idle sockets", _health, None),
    ("idle_sockets", "idle sockets closed by the server",
     lambda r: f"{r['closed_after_wait']} / 1100 after {r['wait_s']:.0f} s", None),
    ("dry_bomb", "victims that ran to their length / 3 (bomb status)",
     lambda r: f"{r['victim_finish'].count('length')} ({r['bomb_status']})", None),
    ("dry_bomb", "victim tok/s bombed / clean", lambda r: _ratio(r["victim_rate_ratio"]), None),
    ("disconnect", "follow-up TTFT s after 4 leavers",
     lambda r: f"{r['followup_ttft_s']:.2f} ({'ok' if r['followup_ok'] else 'failed'})",
     lambda r: r["followup_ttft_s"]),
    ("schema_bomb", "3 bombs: statuses (all answered in s; client gives up at 30)",
     lambda r: f"{', '.join(map(str, r['statuses']))} ({r['answered_s']:.2f})", None),
    ("schema_bomb", "RSS MiB at the answers / 10 s later", _bomb_rss, None),
    ("schema_bomb", "RSS MiB idle -> peak (ratio: of the rise)", lambda r: f"{r['rss_idle_mib']:.0f} -> "
     f"{r['rss_peak_mib']:.0f}", lambda r: r["rss_peak_mib"] - r["rss_idle_mib"]),
    ("schema_bomb", "victim stream ok, worst gap ms", _victim, lambda r: r["victim_max_gap_ms"]),
    ("schema_bomb", "follow-up `{\"type\": \"integer\"}` status", lambda r: str(r["followup"]),
     None),
    ("store_growth", "turns answered 200 (of 20; body MB)",
     lambda r: f"{r['statuses'].count(200)} / {r['turns']} ({r['body_mb']:.1f})", None),
    ("store_growth", "RSS MiB after turn 1 -> turn 20",
     lambda r: f"{r['rss_turn1_mib']:.0f} -> {r['rss_end_mib']:.0f}", None),
    ("store_growth", "RSS growth MiB over turns 2-20", lambda r: f"{r['growth_mib']:.0f}",
     lambda r: r["growth_mib"]),
    ("store_growth", "turn time p50 s", lambda r: f"{r['turn_p50_s']:.2f}",
     lambda r: r["turn_p50_s"]),
    ("queue_churn", "deepest queue on /health (limit 4; samples)",
     lambda r: f"{_f(r['max_queued'], 'd')} ({r['samples']})", lambda r: r["max_queued"]),
    ("queue_churn", "answers 200 / 503 / other",
     lambda r: f"{r['served']} / {r['refused_503']} / {r['other']}", None),
    ("queue_churn", "200s per s", lambda r: f"{r['served_per_s']:.0f}",
     lambda r: r["served_per_s"]),
    ("unread_streams", "third request's first token s",
     lambda r: f"{_f(r['third_ttft_s'], '.2f')} ({'ok' if r['third_ok'] else r['third_error']})",
     lambda r: r["third_ttft_s"]),
    ("unread_streams", "tokens generated for the 2 unread (of 12,000)",
     lambda r: _f(r["unread_tokens"], "d"), lambda r: r["unread_tokens"]),
    ("unread_streams", "engine idle s after the unread were sent",
     lambda r: _f(r["idle_after_s"], ".1f"), lambda r: r["idle_after_s"]),
]


def ram_gib() -> int:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))


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
            results[name].update(run_one(name, cmd, ready, env, scen, logdir, args.idle_wait))
    doc = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{machine()['nproc']} CPUs ({machine()['cpu']}), {ram_gib()} GiB RAM, "
                      f"1-min load {loadavg()}",
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
