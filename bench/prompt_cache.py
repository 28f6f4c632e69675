"""Prompt (prefix) cache: TTFT of a growing agent conversation, mlxcel with / without its
prompt cache vs ``mlx_lm.server`` (which has its own).

Rules, and why:

- One conversation of ``--turns`` turns is built in advance, deterministically (system
  prompt; per turn a tool-output-like user message and a fixed assistant reply), and turn
  k sends ``messages[: 2k + 2]``: every server sees byte-identical prompts, each a prefix
  of the next up to its last user message. The last prompt is sized to
  ``--target-tokens``, under the checkpoint's context.
- Servers (``mlxcel``, ``mlxcel-nocache`` = ``--no-cache-prompt``, ``mlx_lm``) run one at
  a time on the same bench checkpoint (``30m`` by default), each warmed up with a shorter
  conversation of other content: nothing a warm-up leaves in a cache is a prefix of the
  measured conversation.
- Each turn asks for a short streamed greedy completion, so TTFT is mostly prefill.
- Reported: per-turn TTFT, prompt and cached tokens (medians over ``--repeats``, each
  with its own content), mlxcel's ``/v1/cache/stats``, and warm-turn (2..N) medians with
  the ratios mlxcel / no-cache (target <= 0.2) and mlxcel / mlx_lm (target <= 1).

    python bench/prompt_cache.py                       # 30m checkpoint, 10 turns, 3 servers
    python bench/prompt_cache.py --checkpoint tiny --turns 4 --repeats 1

Results go to ``--out`` (JSON; one entry per checkpoint label, a re-run replaces it) and
the markdown file next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import pathlib
import random
import shlex
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint, checkpoint_info
from mlxcel.testing.servers import (
    Server,
    fmt,
    health,
    loadavg,
    machine,
    ratio,
    server_argv,
    stream_chat,
    versions,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
VARIANTS = ("mlxcel", "mlxcel-nocache", "mlx_lm")
MLXCEL_EXTRA = {"mlxcel": [], "mlxcel-nocache": ["--no-cache-prompt"]}


# -- conversation -------------------------------------------------------------------------
NOUNS = (
    "parser config cache scheduler tokenizer buffer socket worker queue router handler "
    "session index manifest registry sampler decoder encoder batch slot ledger harbor meadow "
    "lantern falcon glacier orchid copper marble kettle quartz violet ember window thread "
    "signal packet module fixture backend frontend plugin template budget metric"
).split()
VERBS = (
    "parses loads stores flushes rejects retries schedules decodes encodes merges splits "
    "validates caches evicts streams reads writes updates resolves checks builds"
).split()
ADJS = (
    "stale partial empty nested cached remote local quiet broken slow fast shared strict "
    "lazy eager missing valid unique"
).split()
STATUSES = ("PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED", "XFAIL")
TOOLS = ("run_tests", "grep", "read_file", "list_dir", "git_diff", "run_linter")


def _sentence(rng: random.Random) -> str:
    n1, n2 = rng.choice(NOUNS), rng.choice(NOUNS)
    return (
        f"The {rng.choice(ADJS)} {n1} {rng.choice(VERBS)} the {n2} "
        f"{rng.choice(('before', 'after', 'while', 'unless', 'because'))} the "
        f"{rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.randint(2, 999)} "
        f"{rng.choice(NOUNS)}s."
    )


def _block(rng: random.Random, tool: str) -> str:
    w = lambda: rng.choice(NOUNS)  # noqa: E731
    if tool == "run_tests":
        return "\n".join(
            f"tests/test_{w()}.py::test_{w()}_{w()} {rng.choice(STATUSES)} "
            f"[{rng.randint(1, 99):3d}%]"
            for _ in range(rng.randint(3, 6))
        )
    if tool == "grep":
        return "\n".join(
            f"src/{w()}/{w()}.py:{rng.randint(1, 900)}:    self.{w()} = {w()}_{w()}()"
            for _ in range(rng.randint(3, 6))
        )
    if tool == "list_dir":
        return "\n".join(
            f"{rng.randint(10, 9999):>5} src/{w()}/{w()}_{w()}.py" for _ in range(rng.randint(3, 6))
        )
    if tool == "git_diff":
        return (
            f"--- a/src/{w()}.py\n+++ b/src/{w()}.py\n@@ -{rng.randint(1, 400)},7 "
            f"+{rng.randint(1, 400)},8 @@\n-    return self.{w()}\n+    return self.{w()} "
            f"or {w()}_{rng.randint(0, 99)}"
        )
    if tool == "run_linter":
        return "\n".join(
            f"src/{w()}.py:{rng.randint(1, 500)}:{rng.randint(1, 80)}: "
            f"E{rng.randint(100, 999)} {rng.choice(ADJS)} {w()} in {w()}"
            for _ in range(rng.randint(2, 5))
        )
    return (  # read_file
        f"def {w()}_{w()}(self, {w()}, {w()}={rng.randint(0, 64)}):\n"
        f'    """{_sentence(rng)}"""\n'
        f"    if not self.{w()}:\n        raise ValueError('{rng.choice(ADJS)} {w()}')\n"
        f"    return self.{w()}.{rng.choice(VERBS)}({w()})"
    )


def _user_message(rng: random.Random, turn: int, budget: int, count) -> str:
    """Tool-output-like text of about ``budget`` tokens (whole blocks / sentences)."""
    tool = TOOLS[turn % len(TOOLS)]
    parts = [f"Tool result ({tool}, step {turn + 1}):"]
    while True:
        piece = _block(rng, rng.choice(TOOLS)) if rng.random() < 0.6 else _sentence(rng)
        if count("\n".join([*parts, piece])) > budget:
            break
        parts.append(piece)
    parts.append(f"What should I look at next? {_sentence(rng)}")
    return "\n".join(parts)


def _assistant_reply(rng: random.Random, turn: int) -> str:
    return (
        f"Step {turn + 1}: the {rng.choice(ADJS)} {rng.choice(NOUNS)} looks suspicious. "
        f"I will call {rng.choice(TOOLS)} on src/{rng.choice(NOUNS)}.py next."
    )


def build_conversation(
    seed: str, turns: int, target_tokens: int, count, max_tokens: int
) -> list[dict[str, str]]:
    """[system, user_0, assistant_0, ..., user_{turns-1}]; turn k sends messages[:2k+2].
    The user messages are sized so that the last turn's templated prompt is about
    ``target_tokens`` (content tokens + ~5 template tokens per message; the budget per
    user message is re-fitted a few times since messages end on whole blocks)."""

    def build(budget: int) -> list[dict[str, str]]:
        rng = random.Random(seed)
        system = (  # the seed comes first: no prefix block is shared with another conversation
            f"[{seed}] You are a coding agent. You work in a Python repository, call "
            "tools one at a time, read their output carefully and answer briefly. "
            + " ".join(_sentence(rng) for _ in range(3))
        )
        msgs = [{"role": "system", "content": system}]
        for k in range(turns):
            msgs.append({"role": "user", "content": _user_message(rng, k, budget, count)})
            if k < turns - 1:
                msgs.append({"role": "assistant", "content": _assistant_reply(rng, k)})
        return msgs

    def estimate(msgs: list[dict[str, str]]) -> int:
        return sum(count(m["content"]) + 5 for m in msgs) + 3

    goal = target_tokens - max_tokens
    budget = max(32, goal // (2 * turns))
    msgs = build(budget)
    for _ in range(6):
        err = goal - estimate(msgs)
        if abs(err) <= max(8, goal // 100):
            break
        budget = max(32, budget + err // turns)
        msgs = build(budget)
    return msgs


def token_counter(path: pathlib.Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return lambda s: len(tok.encode(s, add_special_tokens=False).ids)


# -- client -------------------------------------------------------------------------------
def body_for(variant: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    if variant != "mlx_lm":
        body["ignore_eos"] = True
    return body


async def _converse(
    base: str,
    variant: str,
    msgs: list[dict[str, str]],
    turns: int,
    max_tokens: int,
    read_timeout: float,
) -> list[dict[str, Any]]:
    url = base + "/v1/chat/completions"
    tmo = httpx.Timeout(connect=10.0, read=read_timeout, write=30.0, pool=read_timeout)
    out = []
    async with httpx.AsyncClient(timeout=tmo, trust_env=False) as client:
        for k in range(turns):
            rec = await stream_chat(
                client, url, body_for(variant, msgs[: 2 * k + 2], max_tokens), max_tokens
            )
            rec["turn"] = k + 1
            for key in ("t_send", "t_end", "gaps_ms"):
                rec.pop(key, None)
            out.append({k2: round(v, 4) if isinstance(v, float) else v for k2, v in rec.items()})
    return out


def converse(base: str, variant: str, msgs, turns: int, max_tokens: int, read_timeout: float):
    return asyncio.run(_converse(base, variant, msgs, turns, max_tokens, read_timeout))


def cache_route(base: str, method: str, path: str) -> dict[str, Any]:
    try:
        r = httpx.request(method, base + path, timeout=10.0, trust_env=False)
        try:
            body = r.json()
        except ValueError:
            body = r.text[:300]
        return {"status": r.status_code, "body": body}
    except httpx.HTTPError as exc:
        return {"status": None, "body": f"{type(exc).__name__}: {exc}"[:300]}


# -- one server ---------------------------------------------------------------------------
def run_variant(
    variant: str,
    path: pathlib.Path,
    convs: list[list[dict[str, str]]],
    warm: list[dict[str, str]],
    args: argparse.Namespace,
    logdir: pathlib.Path,
    label: str,
) -> dict[str, Any]:
    name = "mlx_lm" if variant == "mlx_lm" else "mlxcel"
    extra = (
        shlex.split(args.mlx_lm_args)
        if name == "mlx_lm"
        else [*MLXCEL_EXTRA[variant], *shlex.split(args.mlxcel_args)]
    )
    argv, ready = server_argv(name, path, args.parallel, None, extra)
    srv = Server(variant, argv, ready, logdir, label, cwd=ROOT)
    out: dict[str, Any] = {"argv": shlex.join(srv.argv), "loadavg_before": loadavg()}
    srv.start()
    try:
        out["startup_s"] = round(srv.wait_ready(), 2)
        t = time.perf_counter()
        wrec = converse(
            srv.base, variant, warm, args.warmup_turns, args.max_tokens, args.read_timeout
        )
        out["warmup_s"] = round(time.perf_counter() - t, 2)
        out["warmup_errors"] = [r["error"] for r in wrec if r.get("error")]
        if name == "mlxcel":
            out["cache_stats_after_warmup"] = cache_route(srv.base, "GET", "/v1/cache/stats")
        out["runs"] = []
        for i, msgs in enumerate(convs):
            t = time.perf_counter()
            recs = converse(srv.base, variant, msgs, args.turns, args.max_tokens, args.read_timeout)
            out["runs"].append({"wall_s": round(time.perf_counter() - t, 2), "turns": recs})
            print(
                f"  {variant:<15} run {i + 1}: TTFT ms "
                + " ".join(fmt(r.get("ttft_s") and r["ttft_s"] * 1e3) for r in recs)
                + "  cached "
                + " ".join(str(r.get("cached_tokens", 0)) for r in recs)
                + "".join(
                    f"  [turn {r['turn']}: {r['error']} {r.get('detail', '')}]"
                    for r in recs
                    if r.get("error")
                ),
                flush=True,
            )
            if not srv.alive():
                raise RuntimeError(f"{variant} died:\n{srv.log_tail()}")
        if name == "mlxcel":
            out["cache_stats"] = cache_route(srv.base, "GET", "/v1/cache/stats")
            out["health"] = health(srv.base)
            out["cache_reset"] = cache_route(srv.base, "POST", "/v1/cache/reset")
            out["cache_stats_after_reset"] = cache_route(srv.base, "GET", "/v1/cache/stats")
    except BaseException:
        print(f"--- {variant} log tail ({srv.log_path}) ---\n{srv.log_tail()}", file=sys.stderr)
        raise
    finally:
        srv.stop()
        out["loadavg_after"] = loadavg()
        out["log"] = str(srv.log_path)
    return out


# -- summary ------------------------------------------------------------------------------
def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(entry: dict[str, Any], turns: int) -> None:
    per_turn: list[dict[str, Any]] = []
    srv = entry["servers"]
    for k in range(1, turns + 1):
        row: dict[str, Any] = {"turn": k}
        for v, s in srv.items():
            recs = [r["turns"][k - 1] for r in s.get("runs", ()) if len(r["turns"]) >= k]
            ttft = med(
                [
                    r["ttft_s"] * 1e3
                    for r in recs
                    if r.get("ttft_s") is not None and not r.get("error")
                ]
            )
            row[v] = {
                "ttft_ms": ttft,
                "prompt_tokens": med([r.get("prompt_tokens") for r in recs]),
                "cached_tokens": med([r.get("cached_tokens") for r in recs]),
                "errors": [r["error"] for r in recs if r.get("error")],
            }
        row["cache_vs_nocache"] = ratio(*(row.get(v, {}).get("ttft_ms") for v in VARIANTS[:2]))
        row["cache_vs_mlx_lm"] = ratio(
            row.get("mlxcel", {}).get("ttft_ms"), row.get("mlx_lm", {}).get("ttft_ms")
        )
        per_turn.append(row)
    warm = per_turn[1:]
    medians = {
        v: {
            "cold_turn1_ms": per_turn[0].get(v, {}).get("ttft_ms"),
            "warm_median_ms": med([r.get(v, {}).get("ttft_ms") for r in warm]),
        }
        for v in srv
    }
    g = lambda v: medians.get(v, {}).get("warm_median_ms")  # noqa: E731
    ratios = {
        "warm_cache_vs_nocache_ratio_of_medians": ratio(g("mlxcel"), g("mlxcel-nocache")),
        "warm_cache_vs_nocache_median_of_ratios": med([r["cache_vs_nocache"] for r in warm]),
        "warm_cache_vs_mlx_lm_ratio_of_medians": ratio(g("mlxcel"), g("mlx_lm")),
        "warm_cache_vs_mlx_lm_median_of_ratios": med([r["cache_vs_mlx_lm"] for r in warm]),
        "warm_mlx_lm_vs_nocache_ratio_of_medians": ratio(g("mlx_lm"), g("mlxcel-nocache")),
    }
    targets = []
    for what, key, bound in (
        (
            "warm-turn TTFT mlxcel / mlxcel --no-cache-prompt",
            "warm_cache_vs_nocache_ratio_of_medians",
            0.2,
        ),
        ("warm-turn TTFT mlxcel / mlx_lm.server", "warm_cache_vs_mlx_lm_ratio_of_medians", 1.0),
    ):
        val = ratios[key]
        targets.append(
            {
                "target": what,
                "value": val,
                "bound": f"<= {bound}",
                "met": val is not None and val <= bound,
            }
        )
    entry.update(per_turn=per_turn, medians=medians, ratios=ratios, targets=targets)


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        "# Prompt cache: agent conversation TTFT, mlxcel (cache on / off) vs mlx_lm.server",
        "",
        "One deterministic agent-style conversation (system prompt, then per turn a few hundred "
        "tokens of tool-output-like user text and a fixed assistant reply; turn k sends the "
        "first k exchanges + the next user message, identical bytes to every server), "
        "streamed, temperature 0, short completions. Servers run one at a time on the same "
        "random-weight checkpoint, each warmed up with a shorter conversation of different "
        "content. TTFT = request sent -> first content chunk; cached = "
        "`usage.prompt_tokens_details.cached_tokens` (`-`: not reported). Warm turns = 2..N; "
        "ratios < 1 mean mlxcel (cache on) is faster.",
        "",
    ]
    for e in doc["entries"]:
        ck, s, m = e["checkpoint"], e["settings"], e["machine"]
        srv = e["servers"]
        lines += [
            f"## {e['label']} ({ck['model_type']} h{ck['hidden_size']} L{ck['num_hidden_layers']} "
            f"V{ck['vocab_size']}, {ck['params'] / 1e6:.1f}M params, {ck['torch_dtype']})",
            "",
            f"{e['date']}; {m.get('gpu') or str(m['nproc']) + ' CPUs (' + m['cpu'] + ')'}, "
            f"{m['platform']}; {s['turns']} turns, max_tokens {s['max_tokens']}, "
            f"{s['repeats']} measured conversation(s) per server (per-turn median), warm-up "
            f"{s['warmup_turns']} turns; versions "
            + ", ".join(f"{k} {v}" for k, v in e["versions"].items())
            + "; 1-min load average "
            + ", ".join(
                f"{n} {v.get('loadavg_before')} -> {v.get('loadavg_after')}" for n, v in srv.items()
            )
            + ".",
            "",
        ]
        for n, v in srv.items():
            if v.get("error"):
                lines.append(f"- {n}: **failed**: {v['error'][:300]}")
            else:
                lines.append(
                    f"- {n}: `{v['argv']}` (ready in {v.get('startup_s', '?')}s, "
                    f"measured conversation {', '.join(str(r['wall_s']) for r in v.get('runs', ()))}s)"
                )
        lines += [
            "",
            "| turn | prompt tokens | mlxcel TTFT ms | mlxcel cached | no-cache TTFT ms "
            "| mlx_lm TTFT ms | mlx_lm cached | cache / no-cache | cache / mlx_lm |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]

        def cell(row: dict[str, Any], v: str, k: str, nd: int = 0) -> str:
            x = row.get(v, {})
            if x.get("errors"):
                return "err " + ",".join(x["errors"])
            return fmt(x.get(k), nd)

        for row in e["per_turn"]:
            pt = next(
                (row[v]["prompt_tokens"] for v in VARIANTS if row.get(v, {}).get("prompt_tokens")),
                None,
            )
            pts = {row[v]["prompt_tokens"] for v in VARIANTS if row.get(v, {}).get("prompt_tokens")}
            lines.append(
                f"| {row['turn']} | {fmt(pt)}{' (differs)' if len(pts) > 1 else ''} "
                f"| {cell(row, 'mlxcel', 'ttft_ms')} | {cell(row, 'mlxcel', 'cached_tokens')} "
                f"| {cell(row, 'mlxcel-nocache', 'ttft_ms')} | {cell(row, 'mlx_lm', 'ttft_ms')} "
                f"| {cell(row, 'mlx_lm', 'cached_tokens')} "
                f"| {fmt(row['cache_vs_nocache'], 3)} | {fmt(row['cache_vs_mlx_lm'], 2)} |"
            )
        md, r = e["medians"], e["ratios"]
        lines += [
            "",
            "Turn 1 (cold) / warm-turn median TTFT ms: "
            + "; ".join(
                f"{n} {fmt(x['cold_turn1_ms'])} / **{fmt(x['warm_median_ms'])}**"
                for n, x in md.items()
            )
            + ".",
            "",
            f"Warm turns, mlxcel / no-cache: {fmt(r['warm_cache_vs_nocache_ratio_of_medians'], 3)}x "
            f"(ratio of medians), {fmt(r['warm_cache_vs_nocache_median_of_ratios'], 3)}x (median "
            f"of per-turn ratios); mlxcel / mlx_lm: {fmt(r['warm_cache_vs_mlx_lm_ratio_of_medians'], 2)}x"
            f", {fmt(r['warm_cache_vs_mlx_lm_median_of_ratios'], 2)}x; mlx_lm / no-cache: "
            f"{fmt(r['warm_mlx_lm_vs_nocache_ratio_of_medians'], 3)}x.",
            "",
            "Targets: "
            + "; ".join(
                f"{t['target']} = {fmt(t['value'], 3)} ({t['bound']}): "
                f"{'met' if t['met'] else '**missed**'}"
                for t in e["targets"]
            )
            + ".",
            "",
        ]
        for n, v in srv.items():
            st = v.get("cache_stats")
            if st is None:
                continue
            if st.get("status") == 200 and isinstance(st.get("body"), dict):
                b = st["body"]
                keys = (
                    "enabled",
                    "entries",
                    "bytes",
                    "capacity_bytes",
                    "hits",
                    "lookups",
                    "hit_rate",
                    "inserts",
                    "evictions_lru",
                    "evictions_ttl",
                    "rejections_oversized",
                    "block_size",
                )
                shown = ", ".join(f"{k} {b[k]}" for k in keys if k in b) or json.dumps(b)[:400]
                reset = v.get("cache_reset", {})
                lines.append(
                    f"- {n} `GET /v1/cache/stats` at the end (after warm-up + measured "
                    f"runs): {shown}; `POST /v1/cache/reset` -> {reset.get('status')} "
                    f"{json.dumps(reset.get('body'))[:200]}"
                )
            else:
                lines.append(f"- {n} `GET /v1/cache/stats` -> {st.get('status')} (not available)")
        c = e.get("code") or {}
        lines += [
            "",
            f"Reproduce: `{e['command']}` (took {e.get('total_s')}s; code: HEAD "
            f"{c.get('head')}"
            + (
                f", uncommitted diff sha256 {c['diff_sha256']} over {c['dirty_files']} files"
                if c.get("diff_sha256")
                else ""
            )
            + ")",
            "",
        ]
        lines += [f"- {note}" for note in e.get("notes", ())] + ([""] if e.get("notes") else [])
    return "\n".join(lines).rstrip() + "\n"


def save(out: pathlib.Path, entry: dict[str, Any], fresh: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    old: list[dict[str, Any]] = []
    if out.exists() and not fresh:
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(out.read_text()).get("entries", [])
    doc = {
        "benchmark": "prompt_cache",
        "updated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "entries": [e for e in old if e["label"] != entry["label"]] + [entry],
    }
    out.write_text(json.dumps(doc, indent=1, default=lambda o: None) + "\n")
    out.with_suffix(".md").write_text(render_md(doc))


def code_state() -> dict[str, Any]:
    """HEAD and a digest of the uncommitted diff (results taken on a dirty tree)."""
    import hashlib
    import subprocess

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    diff = git("diff", "HEAD")
    return {
        "head": git("rev-parse", "--short", "HEAD").strip(),
        "dirty_files": len(git("status", "--short").splitlines()),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:12] if diff else None,
    }


# -- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="30m", choices=sorted(CHECKPOINTS))
    ap.add_argument("--model", default=None, help="serve this checkpoint directory instead")
    ap.add_argument("--label", default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--target-tokens", type=int, default=3900,
                    help="approximate prompt tokens of the last turn")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1,
                    help="measured conversations per server (different content each)")
    ap.add_argument("--warmup-turns", type=int, default=2)
    ap.add_argument("--warmup-tokens", type=int, default=800,
                    help="approximate prompt tokens of the warm-up's last turn")
    ap.add_argument("--parallel", type=int, default=4, help="mlxcel --parallel (its default)")
    ap.add_argument("--mlxcel-args", default="")
    ap.add_argument("--mlx-lm-args", default="")
    ap.add_argument("--read-timeout", type=float, default=180.0)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--out", default="bench/results/prompt_cache.json")
    ap.add_argument("--fresh", action="store_true", help="drop other entries in --out")
    ap.add_argument("--note", action="append", default=[], help="free-text note for the report")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v}")

    if args.model:
        path = pathlib.Path(args.model).resolve()
        label = args.label or path.name
    else:
        kw = dict(CHECKPOINTS[args.checkpoint])
        path, label = bench_checkpoint(kw.pop("shape"), **kw), args.checkpoint
    info = checkpoint_info(path)
    count = token_counter(path)
    convs = [
        build_conversation(f"main-{i}", args.turns, args.target_tokens, count, args.max_tokens)
        for i in range(args.repeats)
    ]
    warm = build_conversation(
        "warm-up", args.warmup_turns, args.warmup_tokens, count, args.max_tokens
    )
    logdir = pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="mlxcel-prompt-cache-"))
    logdir.mkdir(parents=True, exist_ok=True)
    cmd_args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--fresh"]
    out = pathlib.Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    print(
        f"== {label}: {info['params'] / 1e6:.2f}M params, {path}; user messages ~"
        f"{count(convs[0][1]['content'])} tokens each",
        flush=True,
    )
    entry: dict[str, Any] = {
        "label": label,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/prompt_cache.py", *cmd_args]),
        "checkpoint": info,
        "settings": {
            k: getattr(args, k)
            for k in (
                "turns",
                "target_tokens",
                "max_tokens",
                "repeats",
                "warmup_turns",
                "warmup_tokens",
                "parallel",
                "mlxcel_args",
                "mlx_lm_args",
            )
        }
        | {"temperature": 0.0},
        "conversation_example": convs[0][:3],
        "versions": versions(),
        "machine": machine(),
        "code": code_state(),
        "notes": args.note,
        "servers": {},
    }
    t0 = time.perf_counter()
    for v in variants:
        try:
            entry["servers"][v] = run_variant(v, path, convs, warm, args, logdir, label)
        except Exception as exc:  # record it; the other servers still run
            print(f"{v} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            entry["servers"][v] = {
                "argv": "",
                "runs": [],
                "error": f"{type(exc).__name__}: {exc}"[:2000],
            }
        summarize(entry, args.turns)
        entry["total_s"] = round(time.perf_counter() - t0, 1)
        save(out, entry, args.fresh)
    for n, x in entry["medians"].items():
        print(
            f"  {n:<15} turn-1 TTFT {fmt(x['cold_turn1_ms'])} ms, warm median "
            f"{fmt(x['warm_median_ms'])} ms"
        )
    for k, x in entry["ratios"].items():
        print(f"  {k}: {fmt(x, 3)}")
    for t in entry["targets"]:
        print(
            f"  target {t['target']} {t['bound']}: {fmt(t['value'], 3)} "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    print(f"\nwrote {out} and {out.with_suffix('.md')} in {entry['total_s']}s; logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
