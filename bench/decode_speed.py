"""Single-stream decode speed: mlxcel-server vs ``mlx_lm.server`` on the same checkpoint.

Both servers are started as subprocesses on free 127.0.0.1 ports, serving one tiny
random-weight checkpoint (EOS suppressed so greedy decoding runs to ``--max-tokens``).
Streamed chat completions (temperature 0) alternate between the servers, one warm-up
request each being discarded. Per request we record TTFT (request sent -> first content
delta) and decode tok/s = (completion_tokens - 1) / (t_last_content - t_first_content),
with completion_tokens taken from the server's usage chunk (``stream_options``).

Results for each checkpoint configuration are merged into ``--out`` (JSON, one entry per
configuration; a re-run replaces the entry with the same configuration) and rendered to a
markdown file next to it (``decode_speed.md``).

    python bench/decode_speed.py                                 # tiny default checkpoint
    python bench/decode_speed.py --hidden-size 256 --num-layers 4
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import inspect
import json
import os
import pathlib
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from serving import Server, machine, versions  # noqa: E402  (bench/ is on sys.path when run as a script)

HOST = "127.0.0.1"
ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent
PROMPT = "Write a long story about a lighthouse keeper and the sea."
RATIO_KEYS = ("decode_tok_s", "ttft_s", "e2e_tok_s")
VARY_WORDS = ("Zebra", "Quartz", "Violet", "Jungle", "Xenon", "Kettle", "Yonder", "Marble")
STARTUP_TIMEOUT_S = 180.0
REQUEST_DEADLINE_S = 300.0
TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=5.0)


# -- servers ------------------------------------------------------------------------------
def stream_chat(
    client: httpx.Client, base: str, max_tokens: int, prompt: str = PROMPT
) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    times: list[float] = []
    usage: dict[str, Any] | None = None
    finish = None
    t0 = time.perf_counter()
    deadline = t0 + REQUEST_DEADLINE_S
    with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            now = time.perf_counter()
            if now > deadline:
                raise TimeoutError(f"request to {base} exceeded {REQUEST_DEADLINE_S:.0f}s")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    times.append(now)
                finish = choice.get("finish_reason") or finish
    t_end = time.perf_counter()
    if len(times) < 2:
        raise RuntimeError(f"{base}: fewer than 2 content chunks ({len(times)})")
    tokens = int(usage["completion_tokens"]) if usage else len(times)
    span = times[-1] - times[0]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {
        "ttft_s": times[0] - t0,
        "e2e_tok_s": tokens / (times[-1] - t0),
        "cached_prompt_tokens": int(
            ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        ),
        "decode_tok_s": (tokens - 1) / span if span > 0 else float("nan"),
        "completion_tokens": tokens,
        "usage": usage,
        "content_chunks": len(times),
        "decode_span_s": span,
        "total_s": t_end - t0,
        "itl_median_ms": statistics.median(gaps) * 1e3,
        "itl_max_ms": max(gaps) * 1e3,
        "finish_reason": finish,
    }


# -- helpers ------------------------------------------------------------------------------
def checkpoint_params(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kwargs passed to cached_checkpoint, fully resolved parameters for the report)."""
    from mlxcel.testing.checkpoint import build_checkpoint

    kw: dict[str, Any] = {"suppress_eos": True}
    if args.hidden_size is not None:
        kw["hidden_size"] = args.hidden_size
    if args.num_layers is not None:
        kw["num_layers"] = args.num_layers
    if args.dtype is not None:
        kw["dtype"] = args.dtype
    defaults = {
        k: p.default
        for k, p in inspect.signature(build_checkpoint).parameters.items()
        if p.default is not inspect.Parameter.empty and k != "shape"
    }
    resolved = {"shape": args.shape, **defaults, **kw}
    if resolved.get("intermediate_size") is None:
        resolved["intermediate_size"] = 3 * resolved["hidden_size"]
    return kw, resolved


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def entry_label(e: dict[str, Any]) -> str:
    vary = e["settings"].get("vary_prompt")
    return config_label(e["checkpoint"]) + (", varied prompts" if vary else "")


def config_label(p: dict[str, Any]) -> str:
    return f"{p['shape']} h{p['hidden_size']} L{p['num_layers']} V{p['vocab_size']} {p['dtype']}"


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        "# Decode speed: mlxcel-server vs mlx_lm.server",
        "",
        "Single stream, greedy (temperature 0), streamed chat completions, random-weight "
        "checkpoint with EOS suppressed. decode tok/s = (completion_tokens - 1) / "
        "(last content chunk - first content chunk), measured by the client; TTFT = request "
        "sent -> first content chunk. Medians over the measured runs (servers alternated, "
        "one warm-up each discarded). e2e tok/s = completion_tokens / (last content chunk - "
        "request sent). Cached prompt tokens: what the server's usage reports as reused from "
        "its prompt cache (mlx_lm reuses the KV cache of a repeated prompt; mlxcel has no "
        "prompt cache yet), so TTFT compares a cached vs a full prefill unless the entry says "
        "varied prompts. Ratio = mlxcel / mlx_lm (tok/s: > 1 means mlxcel is faster; TTFT: "
        "< 1 means mlxcel is faster). Per-pair ratios compare back-to-back runs and are less "
        "sensitive to load drift on a shared machine.",
        "",
    ]
    for entry in doc["configs"]:
        s, m = entry["settings"], entry["medians"]
        ratio = entry["ratio_mlxcel_over_mlx_lm"]
        lines += [
            f"## {entry_label(entry)}",
            "",
            f"{entry['date']} - max_tokens {s['max_tokens']}, {s['runs']} runs per server; "
            f"mlx {entry['versions'].get('mlx')}, mlx-lm {entry['versions'].get('mlx-lm')}, "
            f"mlxcel {entry['versions'].get('mlxcel')}; {entry['machine']['nproc']} CPUs "
            f"({entry['machine']['cpu'] or entry['machine'].get('machine', '?')}), "
            f"{entry['machine']['platform']}; 1-min load average "
            f"{entry['machine'].get('loadavg_1m_before', '?')} -> "
            f"{entry['machine'].get('loadavg_1m_after', '?')}",
            "",
            "| server | decode tok/s | TTFT ms | e2e tok/s | median ITL ms | tokens "
            "| cached prompt tokens |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in ("mlxcel", "mlx_lm"):
            lines.append(
                f"| {name} | {m[name]['decode_tok_s']:.1f} | "
                f"{m[name]['ttft_s'] * 1e3:.1f} | {m[name]['e2e_tok_s']:.1f} | "
                f"{m[name]['itl_median_ms']:.2f} | "
                f"{m[name]['completion_tokens']:.0f} | {m[name]['cached_prompt_tokens']:.0f} |"
            )
        lines += [
            f"| **mlxcel / mlx_lm** | **{ratio['decode_tok_s']:.2f}x** | "
            f"{ratio['ttft_s']:.2f}x | {ratio['e2e_tok_s']:.2f}x | | | |",
            f"| median of per-pair ratios | {entry['paired_ratio_median']['decode_tok_s']:.2f}x "
            f"| {entry['paired_ratio_median']['ttft_s']:.2f}x "
            f"| {entry['paired_ratio_median']['e2e_tok_s']:.2f}x | | | |",
            "",
            f"Reproduce: `{entry['command']}`",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def print_table(entry: dict[str, Any]) -> None:
    m, ratio = entry["medians"], entry["ratio_mlxcel_over_mlx_lm"]
    print(
        f"\n{entry_label(entry)}  (medians of {entry['settings']['runs']} "
        f"runs, max_tokens {entry['settings']['max_tokens']})"
    )
    print(f"{'server':<10} {'decode tok/s':>13} {'TTFT ms':>9} {'ITL ms':>8} {'tokens':>7}")
    for name in ("mlxcel", "mlx_lm"):
        print(
            f"{name:<10} {m[name]['decode_tok_s']:>13.1f} {m[name]['ttft_s'] * 1e3:>9.1f} "
            f"{m[name]['itl_median_ms']:>8.2f} {m[name]['completion_tokens']:>7.0f}"
        )
    print(f"{'ratio':<10} {ratio['decode_tok_s']:>12.2f}x {ratio['ttft_s']:>8.2f}x")
    pr = entry["paired_ratio_median"]
    print(f"{'paired':<10} {pr['decode_tok_s']:>12.2f}x {pr['ttft_s']:>8.2f}x")


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3", choices=("qwen3", "llama"))
    ap.add_argument(
        "--hidden-size",
        type=int,
        default=None,
        help="checkpoint hidden size (default: the builder's tiny default)",
    )
    ap.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="checkpoint layers (default: the builder's tiny default)",
    )
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7, help="measured runs per server")
    ap.add_argument("--out", default="bench/results/decode_speed.json")
    ap.add_argument(
        "--fresh", action="store_true", help="drop results of other configurations already in --out"
    )
    ap.add_argument(
        "--dtype", default=None, help="checkpoint dtype (default: the builder's, bfloat16)"
    )
    ap.add_argument(
        "--vary-prompt",
        action="store_true",
        help="prefix each pair's prompt with a different word (defeats prompt caching)",
    )
    args = ap.parse_args(argv)
    if args.runs < 1 or args.max_tokens < 2:
        ap.error("--runs must be >= 1 and --max-tokens >= 2")

    from mlxcel.testing.checkpoint import cached_checkpoint

    kw, params = checkpoint_params(args)
    t = time.perf_counter()
    path = cached_checkpoint(args.shape, **kw)
    print(f"checkpoint {config_label(params)}: {path} ({time.perf_counter() - t:.1f}s)")

    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-"))
    servers = {
        "mlxcel": Server(
            "mlxcel",
            [str(BIN / "mlxcel-server"), "--model", str(path), "--parallel", "1"],
            "/health",
            logdir,
            "decode",
        ),
        "mlx_lm": Server(
            "mlx_lm",
            [sys.executable, "-m", "mlx_lm", "server", "--model", str(path)],
            "/v1/models",
            logdir,
            "decode",
        ),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}

    def prompt_for(i: int) -> str:
        # --vary-prompt: a different first word per pair defeats mlx_lm's prompt (prefix)
        # cache, so TTFT includes a full prefill on both servers.
        return f"{VARY_WORDS[i % len(VARY_WORDS)]}. {PROMPT}" if args.vary_prompt else PROMPT

    load_before = os.getloadavg()
    warmup: dict[str, dict[str, Any]] = {}
    try:
        with httpx.Client(timeout=TIMEOUT, trust_env=False) as client:
            for srv in servers.values():  # start both, then wait: loads overlap
                srv.start()
            for name, srv in servers.items():
                print(f"{name}: ready in {srv.wait_ready():.1f}s on {srv.base}")
            for name, srv in servers.items():
                warmup[name] = stream_chat(client, srv.base, args.max_tokens, prompt_for(-1))
                print(f"warm-up {name}: {warmup[name]['decode_tok_s']:.1f} tok/s (discarded)")
            for i in range(args.runs):
                for name, srv in servers.items():
                    r = stream_chat(client, srv.base, args.max_tokens, prompt_for(i))
                    runs[name].append(r)
                    print(
                        f"run {i + 1}/{args.runs} {name:<7} {r['decode_tok_s']:8.1f} tok/s  "
                        f"TTFT {r['ttft_s'] * 1e3:7.1f} ms  {r['completion_tokens']} tokens"
                    )
    except BaseException:
        for srv in servers.values():
            print(
                f"--- {srv.name} log tail ({srv.log_path}) ---\n{srv.log_tail()}", file=sys.stderr
            )
        raise
    finally:
        for srv in servers.values():
            srv.stop()

    for name, rs in runs.items():
        short = [r for r in rs if r["completion_tokens"] != args.max_tokens]
        if short:
            print(
                f"warning: {name}: {len(short)} runs stopped before max_tokens "
                f"({[r['completion_tokens'] for r in short]})",
                file=sys.stderr,
            )

    keys = (
        "decode_tok_s",
        "ttft_s",
        "e2e_tok_s",
        "itl_median_ms",
        "completion_tokens",
        "cached_prompt_tokens",
        "total_s",
    )
    medians = {name: {k: median(rs, k) for k in keys} for name, rs in runs.items()}
    ratio = {k: medians["mlxcel"][k] / medians["mlx_lm"][k] for k in RATIO_KEYS}
    # Ratio within each back-to-back (mlxcel, mlx_lm) pair: robust to slow load drift.
    paired = {
        k: statistics.median(
            a[k] / b[k] for a, b in zip(runs["mlxcel"], runs["mlx_lm"], strict=True)
        )
        for k in RATIO_KEYS
    }
    cmd_args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--fresh"]
    entry = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/decode_speed.py", *cmd_args]),
        "checkpoint": {**params, "path": str(path)},
        "settings": {
            "max_tokens": args.max_tokens,
            "runs": args.runs,
            "prompt": PROMPT,
            "vary_prompt": args.vary_prompt,
            "temperature": 0.0,
            "order": "alternating mlxcel, mlx_lm",
            "warmup_runs_discarded": 1,
            "servers": {n: shlex.join(s.argv) for n, s in servers.items()},
        },
        "versions": versions(),
        "machine": {
            **machine(),
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "warmup": warmup,
        "runs": runs,
        "medians": medians,
        "ratio_mlxcel_over_mlx_lm": ratio,
        "paired_ratio_median": paired,
    }
    print_table(entry)

    out = pathlib.Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"benchmark": "decode_speed", "configs": []}
    if out.exists() and not args.fresh:
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(out.read_text())
    key = entry_label(entry)
    others = [e for e in doc.get("configs", []) if entry_label(e) != key]
    doc = {
        "benchmark": "decode_speed",
        "updated": entry["date"],
        "versions": entry["versions"],
        "machine": entry["machine"],
        "configs": sorted(
            [*others, entry],
            key=lambda e: (
                e["checkpoint"]["hidden_size"],
                e["checkpoint"]["num_layers"],
                bool(e["settings"].get("vary_prompt")),
            ),
        ),
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(render_md(doc))
    print(
        f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} and "
        f"{md.relative_to(ROOT) if md.is_relative_to(ROOT) else md}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
