"""Streaming throughput: mlxcel-server vs ``mlx_lm.server`` on the same checkpoint.

Rules, and why:

- Servers run one at a time, alone, on the same random-weight checkpoint, each warmed up
  first: two servers on one machine would measure each other.
- The checkpoint is :func:`mlxcel.testing.bench_checkpoints.bench_checkpoint` (EOS, special,
  partial-UTF-8 and whitespace-only tokens never picked) and mlxcel also gets
  ``ignore_eos``: every request then yields exactly ``max_tokens`` tokens, one content
  chunk each, on both servers, so chunk timings compare.
- Load is a closed loop (C streams, each sending its next request when its last one
  ended; N requests per level), greedy, fixed ``max_tokens``, a unique prompt prefix per
  request: no prompt cache can shorten a prefill.
- Report ratios mlxcel / mlx_lm and medians/percentiles, never one absolute time: the
  machine's load moves absolute numbers (the 1-min load average is recorded).
- Modes: ``defaults`` (each server's own; mlxcel gets only ``--parallel``) and
  ``same-dtype`` (mlxcel ``--dtype`` = the checkpoint's, as mlx_lm computes): separates
  the engine's gain from the dtype/BLAS gain.
- Concurrency 1 is the single-stream decode-speed case (per-stream decode tok/s =
  (tokens - 1) / (last - first content chunk)); ``make bench`` runs it.

Per level: aggregate tok/s (completion tokens / level wall time), TTFT p50/p95, ITL
(pooled chunk gaps), TPOT (per request), failures (HTTP status, refused / dropped
connection, timeout, no [DONE], short response) and mlxcel's engine counters.

    python bench/serving.py                          # tiny + 30m checkpoints, both modes
    python bench/serving.py --checkpoint tiny --modes defaults --concurrency 1 \
        --max-tokens 256 --requests 7 --out bench/results/decode_speed.json   # decode speed
    python bench/serving.py --checkpoint gemma4-tiny,gemma4-30m --modes defaults \
        --concurrency 1,16                      # Gemma 4 shapes; targets cpu-gemma4
    python bench/serving.py --model /path/ckpt --label llama3-8b --concurrency 1,8,64 \
        --raw-json raw_loop.json --targets gpu --out bench/results/serving_gpu.json
    python bench/serving.py --model /path/ckpt --label llama3-8b-arrival --concurrency 1,64 \
        --max-tokens 128 --requests-cap 128 --raw-json raw_loop.json --targets gpu-arrival \
        --out serving_gpu.json   # 128 requests at C = 64: a second wave as the first ends

Results are merged into ``--out`` (JSON; one entry per checkpoint label and mode, a re-run
replaces it) and rendered to the markdown file next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import multiprocessing as mp
import pathlib
import shlex
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from mlxcel.testing.bench_checkpoints import (
    CHECKPOINTS,
    TARGETS,
    bench_checkpoint,
    check_targets,
    checkpoint_info,
)
from mlxcel.testing.bench_report import fmt, ratio
from mlxcel.testing.servers import (
    Server,
    bench_prompt,
    health,
    loadavg,
    machine,
    server_argv,
    spawn_env,
    stream_chat,
    versions,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SERVERS = ("mlxcel", "mlx_lm")
DIST = "mlxcel-dist"  # --distributed: mlxcel over 2 ranks of the ring backend on this host


# -- client -------------------------------------------------------------------------------
def request_body(server: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    if server == "mlxcel":
        body["ignore_eos"] = True
    return body


async def _load(
    url: str,
    jobs: list[tuple[int, dict[str, Any]]],
    concurrency: int,
    max_tokens: int,
    start_at: float,
    deadline_s: float,
    timeout: dict[str, float],
) -> list[dict[str, Any]]:
    limits = httpx.Limits(
        max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
    )
    tmo = httpx.Timeout(
        connect=timeout["connect"], read=timeout["read"], write=30.0, pool=timeout["read"]
    )
    pending = list(reversed(jobs))
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=tmo, limits=limits, trust_env=False) as client:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        end_by = start_at + deadline_s

        async def stream() -> None:
            while pending:
                idx, body = pending.pop()
                left = end_by - time.perf_counter()
                if left <= 0:
                    results.append(
                        {"index": idx, "error": "not_sent_level_deadline", "completion_tokens": 0}
                    )
                    continue
                try:
                    rec = await asyncio.wait_for(
                        stream_chat(client, url, body, max_tokens), timeout=left
                    )
                except TimeoutError:
                    rec = {
                        "error": "level_deadline",
                        "completion_tokens": 0,
                        "t_end": time.perf_counter(),
                    }
                rec["index"] = idx
                results.append(rec)

        await asyncio.gather(*(stream() for _ in range(concurrency)))
    return results


def _load_entry(args: tuple) -> list[dict[str, Any]]:
    return asyncio.run(_load(*args))


def run_level(
    base: str,
    server: str,
    tag: str,
    concurrency: int,
    n: int,
    max_tokens: int,
    procs: int,
    deadline_s: float,
    timeout: dict[str, float],
) -> dict[str, Any]:
    """Closed loop: ``concurrency`` streams, ``n`` requests; returns the level's stats."""
    url = base + "/v1/chat/completions"
    jobs = [(i, request_body(server, bench_prompt(tag, i), max_tokens)) for i in range(n)]
    procs = max(1, min(procs, concurrency))
    if procs == 1:
        start_at = time.perf_counter() + 0.05
        records = asyncio.run(
            _load(url, jobs, concurrency, max_tokens, start_at, deadline_s, timeout)
        )
    else:  # several client processes (one Python process cannot parse fast enough)
        shares = [concurrency // procs + (k < concurrency % procs) for k in range(procs)]
        start_at = time.perf_counter() + 3.0  # spawn + imports
        work = [
            (url, jobs[k::procs], shares[k], max_tokens, start_at, deadline_s, timeout)
            for k in range(procs)
        ]
        with mp.get_context("spawn").Pool(procs) as pool:
            records = [r for part in pool.map(_load_entry, work) for r in part]
    records.sort(key=lambda r: r["index"])
    return level_stats(records, start_at, concurrency, n, max_tokens)


def pct(values: list[float], q: float) -> float | None:
    """Percentile with linear interpolation (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def level_stats(
    records: list[dict[str, Any]], start_at: float, concurrency: int, n: int, max_tokens: int
) -> dict[str, Any]:
    ends = [r["t_end"] for r in records if "t_end" in r]
    wall = (max(ends) - start_at) if ends else float("nan")
    tokens = sum(r.get("completion_tokens", 0) for r in records)
    ok = [r for r in records if r.get("error") is None]
    ttfts = [r["ttft_s"] * 1e3 for r in records if r.get("ttft_s") is not None]
    gaps = [g for r in records for g in r.get("gaps_ms", ())]
    failures: dict[str, int] = {}
    for r in records:
        if r.get("error"):
            failures[r["error"]] = failures.get(r["error"], 0) + 1
    details = sorted({r["detail"] for r in records if r.get("detail")})[:5]
    per_request = [
        {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in r.items()
            if k not in ("gaps_ms", "t_send", "t_end")
        }
        | {"itl_p50_ms": round(pct(r["gaps_ms"], 50), 3) if r.get("gaps_ms") else None}
        for r in records
    ]
    decode = [r["decode_tok_s"] for r in records if r.get("decode_tok_s")]
    prompts = [r["prompt_tokens"] for r in records if r.get("prompt_tokens")]
    return {
        "concurrency": concurrency,
        "requests": n,
        "ok": len(ok),
        "failed": n - len(ok),
        "failures": failures,
        "failure_details": details,
        "completion_tokens": tokens,
        "expected_tokens": n * max_tokens,
        "wall_s": wall,
        "agg_tok_s": tokens / wall if wall and wall > 0 else float("nan"),
        "ttft_p50_ms": pct(ttfts, 50),
        "ttft_p95_ms": pct(ttfts, 95),
        "ttft_max_ms": max(ttfts) if ttfts else None,
        "itl_p50_ms": pct(gaps, 50),
        "itl_p95_ms": pct(gaps, 95),
        "itl_mean_ms": statistics.fmean(gaps) if gaps else None,
        # share of chunk gaps under 0.5 ms: tokens that reached the client in bursts
        "itl_burst_share": sum(g < 0.5 for g in gaps) / len(gaps) if gaps else None,
        "tpot_p50_ms": pct([r["tpot_ms"] for r in records if r.get("tpot_ms")], 50),
        "per_stream_decode_tok_s_p50": pct(decode, 50),
        "prompt_tokens_mean": statistics.fmean(prompts) if prompts else None,
        "cached_prompt_tokens": sum(r.get("cached_tokens", 0) for r in records),
        "per_request": per_request,
    }


# -- one (checkpoint, mode) -----------------------------------------------------------------
def warm_up(srv: Server, levels: list[int], tag: str, timeout: dict[str, float]) -> None:
    """One burst per concurrency level (short max_tokens), results discarded."""
    for c in levels:
        run_level(srv.base, srv.name, f"{tag}-warm{c}", c, c, 4, 1, 300.0, timeout)


def run_server(
    name: str,
    path: pathlib.Path,
    mode: str,
    args: argparse.Namespace,
    dtype: str,
    logdir: pathlib.Path,
    tag: str,
) -> dict[str, Any]:
    mine = name in ("mlxcel", DIST)
    extra = shlex.split(args.mlxcel_args if mine else args.mlx_lm_args)
    same = dtype if mine and mode == "same-dtype" else None
    argv, ready = server_argv("mlxcel" if mine else name, path, args.parallel, same, extra)
    if name == DIST:
        argv = dist_argv(argv, args.distributed)
    env = None
    if name == "mlxcel" and args.mlxcel_spawn:  # seen on the H200: cudaSetDevice failed
        env = spawn_env(logdir)
    srv = Server(name, argv, ready, logdir, tag, env, cwd=ROOT)
    timeout = {"connect": args.connect_timeout, "read": args.read_timeout}
    out: dict[str, Any] = {
        "argv": shlex.join(srv.argv),
        "loadavg_before": loadavg(),
        "levels": {},
        "spawn_workaround": env is not None,
    }
    srv.start()
    try:
        out["startup_s"] = round(srv.wait_ready(), 2)
        t = time.perf_counter()
        warm_up(srv, args.concurrency, tag, timeout)
        out["warmup_s"] = round(time.perf_counter() - t, 2)
        for c in args.concurrency:
            n = args.requests if args.requests else max(4, args.requests_factor * c)
            if args.requests_cap:
                n = min(n, max(args.requests_cap, c))
            before = health(srv.base) if mine else None
            st = run_level(
                srv.base,
                name,
                f"{tag}-c{c}",
                c,
                n,
                args.max_tokens,
                args.client_procs or max(1, math.ceil(c / 16)),
                args.level_deadline,
                timeout,
            )
            after = health(srv.base) if mine else None
            if before and after:
                ob, oa = before.get("observability", {}), after.get("observability", {})
                steps = oa.get("decode_steps_processed", 0) - ob.get("decode_steps_processed", 0)
                toks = oa.get("total_decode_tokens", 0) - ob.get("total_decode_tokens", 0)
                st["engine"] = {
                    "decode_steps": steps,
                    "decode_tokens": toks,
                    "mean_batch": round(toks / steps, 2) if steps else None,
                    "prefill_chunks": oa.get("prefill_chunks_processed", 0)
                    - ob.get("prefill_chunks_processed", 0),
                }
            st["server_alive_after"] = srv.alive()
            out["levels"][str(c)] = st
            print(
                f"  {name:<7} c={c:<3} n={n:<4} {st['agg_tok_s']:9.1f} tok/s  "
                f"TTFT p50 {fmt(st['ttft_p50_ms'])} p95 {fmt(st['ttft_p95_ms'])} ms  "
                f"ITL p50 {fmt(st['itl_p50_ms'], 2)} ms (bursts {fmt(st['itl_burst_share'], 2)})"
                f"  TPOT p50 {fmt(st['tpot_p50_ms'], 2)} ms  ok {st['ok']}/{n}"
                + (f"  failures {st['failures']}" if st["failures"] else "")
                + (f"  mean batch {st['engine']['mean_batch']}" if st.get("engine") else ""),
                flush=True,
            )
            if not srv.alive():
                print(f"  {name} died:\n{srv.log_tail()}", file=sys.stderr)
                break
    except BaseException:
        print(f"--- {name} log tail ({srv.log_path}) ---\n{srv.log_tail()}", file=sys.stderr)
        raise
    finally:
        srv.stop()
        out["loadavg_after"] = loadavg()
        out["log"] = str(srv.log_path)
        out["backend_log"] = srv.log_grep("backend")
    return out


RATIO_KEYS = ("agg_tok_s", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "tpot_p50_ms")


def dist_argv(argv: list[str], mode: str) -> list[str]:
    """``server_argv``'s mlxcel command as two ranks on loopback (``mlxcel-server launch``,
    MLX's ring backend), each serving with ``--distributed mode``."""
    from mlxcel.testing.distributed import free_ports

    python, server = argv[:3], argv[3:]  # [python, -m, mlxcel.cli], the server's flags
    return [*python, "launch", "-n", "2", "--hosts", "127.0.0.1", "--starting-port",
            str(free_ports(2)[0]), "--", *server, "--distributed", mode]


def dist_lines(e: dict[str, Any]) -> list[str]:
    """The distributed server against one mlxcel process (ratio = 2 ranks / 1 process)."""
    srv = e["servers"]
    if DIST not in srv or "mlxcel" not in srv:
        return []
    lines = ["| C | N | 1 process tok/s | 2 ranks tok/s | ratio | TTFT p50 ms (1 / 2) | ratio "
             "| TPOT p50 ms (1 / 2) | ratio | failed (1 / 2) |",
             "|---:|---:|---:|---:|---:|---|---:|---|---:|---|"]
    for c, r in sorted(e.get("dist_ratios", {}).items(), key=lambda kv: int(kv[0])):
        a, b = srv["mlxcel"]["levels"][c], srv[DIST]["levels"][c]
        lines.append(
            f"| {c} | {a['requests']} | {fmt(a['agg_tok_s'], 1)} | {fmt(b['agg_tok_s'], 1)} "
            f"| **{fmt(r['agg_tok_s'], 2)}x** | {fmt(a['ttft_p50_ms'])} / "
            f"{fmt(b['ttft_p50_ms'])} | {fmt(r['ttft_p50_ms'], 2)}x | "
            f"{fmt(a['tpot_p50_ms'], 2)} / {fmt(b['tpot_p50_ms'], 2)} | "
            f"{fmt(r['tpot_p50_ms'], 2)}x | {a['failed']} / {b['failed']} |")
    return [*lines, ""]


def compute_ratios(entry: dict[str, Any]) -> None:
    srv = entry["servers"]
    entry["ratios"] = {}
    if all(s in srv for s in SERVERS):
        for c, a in srv["mlxcel"]["levels"].items():
            b = srv["mlx_lm"]["levels"].get(c)
            if b:
                entry["ratios"][c] = {k: ratio(a[k], b[k]) for k in RATIO_KEYS}
    if DIST in srv and "mlxcel" in srv:
        entry["dist_ratios"] = {
            c: {k: ratio(b[k], a[k]) for k in RATIO_KEYS}
            for c, a in srv["mlxcel"]["levels"].items()
            if (b := srv[DIST]["levels"].get(c))}
    raw = entry.get("raw_loop")
    if raw:
        entry["vs_raw"] = {}
        for name in SERVERS:
            if name not in srv:
                continue
            for c, st in srv[name]["levels"].items():
                r = (raw.get("batches") or {}).get(c)
                if r:
                    entry["vs_raw"].setdefault(c, {})[name] = ratio(st["agg_tok_s"], r["tok_s"])


# -- report -------------------------------------------------------------------------------
def entry_title(e: dict[str, Any]) -> str:
    ck = e["checkpoint"]
    return (
        f"{e['label']} ({ck['model_type']} h{ck['hidden_size']} L{ck['num_hidden_layers']} "
        f"V{ck['vocab_size']}, {ck['params'] / 1e6:.1f}M params, {ck['torch_dtype']}) - "
        f"{e['mode']}"
    )


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        "# Concurrent serving: mlxcel-server vs mlx_lm.server",
        "",
        "Closed-loop load: C concurrent streams, N requests per level (each stream sends its "
        "next request when its last one ends), streamed chat completions, temperature 0, "
        "fixed max_tokens, EOS ignored (checkpoint built with EOS logits zeroed; mlxcel also "
        "gets `ignore_eos`; the lm_head rows of special, partial-UTF-8 and whitespace-only "
        "tokens are zeroed too, so every generated token is one content chunk on both "
        "servers), every prompt different. Servers run one at a time on the same "
        "random-weight checkpoint, each warmed up first. Aggregate tok/s = completion tokens "
        "/ level wall time; TTFT = request sent -> first content chunk; ITL = gap between "
        "content chunks (pooled over the level); TPOT = per request (last - first content chunk) "
        "/ (tokens - 1), median over requests (robust to bursty delivery, which makes the "
        "ITL median ~0: the share of gaps under 0.5 ms is shown). Ratio = mlxcel / mlx_lm (tok/s: > 1 better; "
        "TTFT/ITL: < 1 better). `defaults`: each server's own defaults (mlxcel gets only "
        "`--parallel`); `same-dtype`: mlxcel also gets `--dtype` = the checkpoint's dtype, "
        "which mlx_lm always uses. Failures: HTTP errors, refused/dropped connections, "
        "timeouts, short responses.",
        "",
    ]
    for e in doc["entries"]:
        s, srv = e["settings"], e["servers"]
        lines += [f"## {entry_title(e)}", ""]
        m = e["machine"]
        where = m.get("gpu") or f"{m['nproc']} CPUs ({m['cpu']})"
        loads = ", ".join(
            f"{n} {v.get('loadavg_before')} -> {v.get('loadavg_after')}" for n, v in srv.items()
        )
        lines += [
            f"{e['date']}; {where}, {m['platform']}; max_tokens {s['max_tokens']}; "
            f"mlxcel --parallel {s['parallel']}; versions "
            + ", ".join(f"{k} {v}" for k, v in e["versions"].items())
            + f"; 1-min load average {loads}.",
            "",
        ]
        for n, v in srv.items():
            if v.get("error"):
                lines.append(f"- {n}: **failed**: {v['error'][:300]}")
                continue
            extra = ""
            if v.get("backend_log"):  # the log line's key=value fields, without timestamp
                fields = " ".join(v["backend_log"][0].partition(" backend ")[2].split())
                extra = f"; backend: `{fields[:240]}`"
            spawn = (
                " [Granian worker started with the 'spawn' method: workaround for CUDA "
                "initialised before Granian forks]"
                if v.get("spawn_workaround")
                else ""
            )
            lines.append(
                f"- {n}: `{v['argv']}`{spawn} (ready in {v.get('startup_s', '?')}s{extra})"
            )
        lines.append("")
        raw = e.get("raw_loop")
        head = (
            "| C | N | mlxcel tok/s | mlx_lm tok/s | ratio | TTFT p50 ms (mlxcel / mlx_lm) "
            "| ratio | TTFT p95 ms | ratio | ITL p50 ms | ratio | TPOT p50 ms | ratio "
            "| ITL gaps < 0.5 ms | failed (mlxcel / mlx_lm) |"
        )
        sep = "|---:|---:|---:|---:|---:|---|---:|---|---:|---|---:|---|---:|---|---|"
        if raw:
            head += " raw loop tok/s | mlxcel / raw | mlx_lm / raw |"
            sep += "---:|---:|---:|"
        lines += [head, sep]
        cs = sorted({int(c) for v in srv.values() for c in v["levels"]})
        for c in cs:
            a = srv.get("mlxcel", {}).get("levels", {}).get(str(c), {})
            b = srv.get("mlx_lm", {}).get("levels", {}).get(str(c), {})
            r = e["ratios"].get(str(c), {})

            def pair(k: str, nd: int = 0, a=a, b=b) -> str:
                return f"{fmt(a.get(k), nd)} / {fmt(b.get(k), nd)}"

            def rx(k: str, r=r) -> str:
                return f"{r[k]:.2f}x" if r.get(k) is not None else "-"

            def fails(st: dict[str, Any]) -> str:
                if not st:
                    return "-"
                return str(st["failed"]) + (
                    " (" + ", ".join(f"{k} {v}" for k, v in st["failures"].items()) + ")"
                    if st["failures"]
                    else ""
                )

            row = (
                f"| {c} | {a.get('requests', b.get('requests', '-'))} "
                f"| {fmt(a.get('agg_tok_s'), 1)} | {fmt(b.get('agg_tok_s'), 1)} "
                f"| **{rx('agg_tok_s')}** | {pair('ttft_p50_ms')} | {rx('ttft_p50_ms')} "
                f"| {pair('ttft_p95_ms')} | {rx('ttft_p95_ms')} | {pair('itl_p50_ms', 2)} "
                f"| {rx('itl_p50_ms')} | {pair('tpot_p50_ms', 2)} | {rx('tpot_p50_ms')} "
                f"| {pair('itl_burst_share', 2)} | {fails(a)} / {fails(b)} |"
            )
            if raw:
                rr = (raw.get("batches") or {}).get(str(c))
                vr = (e.get("vs_raw") or {}).get(str(c), {})
                row += (
                    f" {fmt(rr['tok_s'], 1) if rr else '-'} "
                    f"| {fmt(vr.get('mlxcel'), 2)} | {fmt(vr.get('mlx_lm'), 2)} |"
                )
            lines.append(row)
        lines.append("")
        engine = [
            (c, srv["mlxcel"]["levels"][c].get("engine"))
            for c in sorted(srv.get("mlxcel", {}).get("levels", {}), key=int)
        ]
        if any(x for _, x in engine):
            lines.append(
                "mlxcel engine counters per level (from /health): "
                + "; ".join(
                    f"C={c}: {x['decode_steps']} decode steps, mean batch {x['mean_batch']}"
                    for c, x in engine
                    if x
                )
                + "."
            )
            lines.append("")
        one = {
            n: v["levels"].get("1", {}).get("per_stream_decode_tok_s_p50") for n, v in srv.items()
        }
        if any(one.values()):
            lines.append(
                "Single-stream decode (C=1, per-stream (tokens - 1) / decode span, median): "
                + ", ".join(f"{n} {fmt(x, 1)} tok/s" for n, x in one.items())
                + (
                    f"; ratio {one['mlxcel'] / one['mlx_lm']:.2f}x"
                    if all(one.values()) and set(one) == set(SERVERS)
                    else ""
                )
                + "."
            )
            lines.append("")
        if raw:
            lines.append(
                "Raw loop (same checkpoint, same machine, no server): "
                + "; ".join(
                    f"B={b}: {fmt(v['tok_s'], 1)} tok/s ({fmt(v['ms_per_step'], 2)} ms/step)"
                    for b, v in sorted(raw["batches"].items(), key=lambda kv: int(kv[0]))
                )
                + f" - {raw.get('method', '')}"
            )
            lines.append("")
        if e.get("targets"):
            lines.append(
                "Targets: "
                + "; ".join(
                    f"{t['target']} = {fmt(t['value'], 2)} ({t['bound']}): "
                    f"{'met' if t['met'] else '**missed**'}"
                    for t in e["targets"]
                )
                + "."
            )
            lines.append("")
        lines += dist_lines(e)
        lines += [f"Reproduce: `{e['command']}`", ""]
        lines += [f"- {note}" for note in e.get("notes", ())] + ([""] if e.get("notes") else [])
    return "\n".join(lines).rstrip() + "\n"


# -- main ---------------------------------------------------------------------------------
def parse_ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="tiny,30m",
                    help=f"comma-separated named checkpoints ({', '.join(CHECKPOINTS)})")
    ap.add_argument("--model", default=None,
                    help="serve this checkpoint directory instead of named ones")
    ap.add_argument("--label", default=None, help="label for --model (default: folder name)")
    ap.add_argument("--modes", default="defaults,same-dtype")
    ap.add_argument("--servers", default="mlxcel,mlx_lm")
    ap.add_argument("--concurrency", type=parse_ints, default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per level (default: max(4, factor x concurrency))")
    ap.add_argument("--requests-factor", type=int, default=2)
    ap.add_argument("--requests-cap", type=int, default=0,
                    help="at most this many requests per level (0: no cap)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=0,
                    help="mlxcel --parallel (default: the highest concurrency)")
    ap.add_argument("--mlxcel-args", default="", help="extra mlxcel-server arguments")
    ap.add_argument(
        "--distributed",
        choices=("tensor", "pipeline"),
        default=None,
        help=f"also run {DIST}: mlxcel over 2 ranks of MLX's ring backend on this host "
        "(`mlxcel-server launch`) in this mode, compared with one mlxcel process",
    )
    ap.add_argument("--mlx-lm-args", default="", help="extra mlx_lm.server arguments")
    ap.add_argument(
        "--mlxcel-spawn",
        action="store_true",
        help="start mlxcel's Granian worker with the 'spawn' start method "
        "(workaround for CUDA initialised before Granian forks)",
    )
    ap.add_argument("--client-procs", type=int, default=0,
                    help="client processes per level (default: ceil(C / 16))")
    ap.add_argument("--connect-timeout", type=float, default=10.0)
    ap.add_argument("--read-timeout", type=float, default=120.0)
    ap.add_argument("--level-deadline", type=float, default=600.0,
                    help="seconds after which a level's unfinished requests count as failed")
    ap.add_argument("--raw-json", default=None,
                    help="raw forward-loop results (bench/gpu/raw_loop.py) to compare with")
    ap.add_argument(
        "--targets",
        choices=sorted(TARGETS),
        default="cpu",
        help="target set (mlxcel.testing.bench_checkpoints.TARGETS; cpu and gpu pick their "
        "-gemma4 set for a gemma4_text checkpoint)",
    )
    ap.add_argument("--note", action="append", default=[],
                    help="a line for the report under each entry (repeatable)")
    ap.add_argument("--log-dir", default=None, help="keep server logs here (default: temp)")
    ap.add_argument("--out", default="bench/results/serving.json")
    ap.add_argument("--fresh", action="store_true", help="drop other entries in --out")
    args = ap.parse_args(argv)
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the servers' process groups are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.parallel = args.parallel or max(args.concurrency)
    modes = [m for m in args.modes.split(",") if m]
    servers = [s for s in args.servers.split(",") if s]
    if args.distributed and DIST not in servers:
        servers.append(DIST)
    for m in modes:
        if m not in ("defaults", "same-dtype"):
            ap.error(f"unknown mode {m}")

    targets: list[tuple[str, pathlib.Path]] = []
    if args.model:
        path = pathlib.Path(args.model).resolve()
        targets.append((args.label or path.name, path))
    else:
        for name in [c for c in args.checkpoint.split(",") if c]:
            kw = dict(CHECKPOINTS[name])
            shape = kw.pop("shape")
            t = time.perf_counter()
            path = bench_checkpoint(shape, **kw)
            targets.append((name, path))
            print(f"checkpoint {name}: {path} ({time.perf_counter() - t:.1f}s)")
    raw = json.loads(pathlib.Path(args.raw_json).read_text()) if args.raw_json else None
    logdir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="mlxcel-serving-"))
    logdir.mkdir(parents=True, exist_ok=True)
    given = list(argv if argv is not None else sys.argv[1:])
    notes = {i for i, a in enumerate(given) if a == "--note"}
    cmd_args = [a for i, a in enumerate(given)  # the reproduce line, without the notes
                if a != "--fresh" and i not in notes and i - 1 not in notes]

    out = pathlib.Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    entries: list[dict[str, Any]] = []
    for label, path in targets:
        info = checkpoint_info(path)
        print(
            f"== {label}: {info['params'] / 1e6:.2f}M parameters "
            f"(h{info['hidden_size']} L{info['num_hidden_layers']} V{info['vocab_size']}, "
            f"{info['torch_dtype']})",
            flush=True,
        )
        for mi, mode in enumerate(modes):
            print(f"-- mode {mode}", flush=True)
            entry: dict[str, Any] = {
                "label": label,
                "mode": mode,
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "command": shlex.join(["python", "bench/serving.py", *cmd_args]),
                "checkpoint": info,
                "settings": {
                    "max_tokens": args.max_tokens,
                    "concurrency": args.concurrency,
                    "requests": args.requests,
                    "requests_factor": args.requests_factor,
                    "requests_cap": args.requests_cap,
                    "parallel": args.parallel,
                    "temperature": 0.0,
                    "connect_timeout_s": args.connect_timeout,
                    "read_timeout_s": args.read_timeout,
                    "prompt_example": bench_prompt("tag", 0),
                },
                "versions": versions(),
                "machine": machine(),
                "servers": {},
                "notes": args.note,
            }
            order = servers if mi % 2 == 0 else list(reversed(servers))
            tag = f"{label}-{mode}"
            if raw:
                entry["raw_loop"] = raw
            for name in order:
                try:
                    entry["servers"][name] = run_server(
                        name, path, mode, args, info["torch_dtype"] or "bfloat16", logdir, tag
                    )
                except Exception as exc:  # record it; the other server still runs
                    print(f"{name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
                    entry["servers"][name] = {
                        "argv": "",
                        "levels": {},
                        "error": f"{type(exc).__name__}: {exc}"[:2000],
                    }
                entry["servers"] = {
                    n: entry["servers"][n] for n in servers if n in entry["servers"]
                }
                compute_ratios(entry)
                entry["targets"] = check_targets(entry, args.targets)
                save(out, [*entries, entry], args.fresh)  # partial results survive
            print_summary(entry)
            entries.append(entry)
    print(f"\nwrote {out} and {out.with_suffix('.md')}; server logs in {logdir}")
    return 0


def print_summary(e: dict[str, Any]) -> None:
    for c, r in e["ratios"].items():
        print(
            f"  ratio c={c:<3} tok/s {fmt(r['agg_tok_s'], 2)}x  TTFT p50 "
            f"{fmt(r['ttft_p50_ms'], 2)}x p95 {fmt(r['ttft_p95_ms'], 2)}x  "
            f"ITL p50 {fmt(r['itl_p50_ms'], 2)}x  TPOT p50 {fmt(r['tpot_p50_ms'], 2)}x"
        )
    for c, v in (e.get("vs_raw") or {}).items():
        print(f"  vs raw loop c={c:<3} " + "  ".join(f"{n} {fmt(x, 2)}" for n, x in v.items()))
    for t in e["targets"]:
        print(
            f"  target {t['target']} {t['bound']}: {fmt(t['value'], 2)} "
            f"{'met' if t['met'] else 'MISSED'}"
        )


def save(out: pathlib.Path, new: list[dict[str, Any]], fresh: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    old: list[dict[str, Any]] = []
    if out.exists() and not fresh:
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(out.read_text()).get("entries", [])
    keys = {(e["label"], e["mode"]) for e in new}
    entries = [e for e in old if (e["label"], e["mode"]) not in keys] + new
    doc = {
        "benchmark": "serving",
        "updated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "entries": entries,
    }
    out.write_text(json.dumps(doc, indent=1, default=lambda o: None) + "\n")
    out.with_suffix(".md").write_text(render_md(doc))


if __name__ == "__main__":
    sys.exit(main())
