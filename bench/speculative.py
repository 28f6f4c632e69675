"""Speculative decoding through the real servers (issue #32): tokens/s, TTFT, time per
output token and acceptance, speculation off against each drafter, in one run.

Each configuration is one server process: mlxcel with ``--prompt-lookup off`` (the
baseline), ``auto`` (prompt lookup under its governors), a draft model (``-md``: a
1B-shaped random checkpoint with the target's tokenizer, unrelated to the target, so its
drafts are almost always wrong: the governor's case), the target drafting for itself
through a truncated copy (its first ``--truncate`` layers: the top of the acceptance range
on random weights), and ``mlx_lm.server`` plain and with ``--draft-model`` (it speculates
only one request at a time). Greedy ``/v1/completions`` streams at each concurrency, two
workloads: ``copy`` (a passage repeated four times, what prompt lookup is for) and
``fresh`` (no repeat; random weights still fall into loops that lookup can copy). The
acceptance is read from each response's ``timings`` (``draft_n_accepted / draft_n``).
Every output is compared with the same server's speculation-off output on the same
prompt: greedy speculation must not change a byte. Each level is first run untimed on
other prompts of its workload (``--no-level-warmup`` skips it): on CUDA a batch size's
first verify and draft forwards compile their kernels, seconds that a level of a few
hundred milliseconds would otherwise carry; the drafter's governors keep what the
untimed run taught them, as a server's do from one request to the next.

    python bench/speculative.py --target 30m --draft-preset tiny-draft --concurrency 1,8 \\
        --max-tokens 64 --out /tmp/spec.json                     # CPU dry run (minutes)
    OUT=$OUT bash bench/gpu/speculative.sh                        # the H200 run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from mlxcel.testing.servers import Server, machine, server_argv, spawn_env, versions

WORDS = ("river stone lantern orchard cobalt meadow harbor violet quarry ember willow "
         "garnet thistle canyon pebble saffron tundra beacon marble juniper").split()


def passage(i: int, n: int) -> str:
    """``n`` words, a different order for each ``i``."""
    step = 7 + 2 * (i % 5)
    return " ".join(WORDS[(i + k * step) % len(WORDS)] for k in range(n))


def prompt(workload: str, i: int) -> str:
    head = f"Request {i}."
    if workload == "copy":
        text = passage(i, 40)
        return f"{head} Copy this text exactly.\n{text}\n{text}\n{text}\n{text}\n"
    return f"{head} " + " ".join(passage(i * 3 + k, 12) for k in range(12))


def truncated_copy(target: pathlib.Path, layers: int, out: pathlib.Path) -> pathlib.Path:
    """The target's first ``layers`` layers with its embeddings, norm and lm_head."""
    import mlx.core as mx

    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in target.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json" and f.is_file():
            shutil.copy(f, tmp / f.name)
    cfg = json.loads((target / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    _save_first_layers(target, layers, tmp / "model.safetensors")
    # MLX keeps freed buffers for reuse: on a GPU this process would hold the target's
    # size while the servers it starts load theirs (their warm-ups ran out of memory)
    mx.clear_cache()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _save_first_layers(target: pathlib.Path, layers: int, out: pathlib.Path) -> None:
    """The target's weights without its layers from ``layers`` on, into ``out``."""
    import mlx.core as mx

    kept: dict[str, Any] = {}
    for shard in sorted(target.glob("*.safetensors")):
        for k, v in mx.load(str(shard)).items():
            parts = k.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            kept[k] = v
    mx.save_safetensors(str(out), kept, metadata={"format": "mlx"})


async def one(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"text": "", "error": None, "timings": None, "tokens": 0}
    times: list[float] = []
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"http_{r.status_code}: {(await r.aread())[:200]!r}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("error"):  # a stream that failed after its headers
                    rec["error"] = f"stream: {json.dumps(chunk['error'])[:200]}"
                    return rec
                now = time.perf_counter()
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        rec["text"] += choice["text"]
                        times.append(now)
                rec["timings"] = chunk.get("timings") or rec["timings"]
                usage = chunk.get("usage")
                if usage:
                    rec["tokens"] = int(usage.get("completion_tokens") or 0)
    except Exception as exc:  # a failed request is counted, not raised
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        return rec
    rec["tokens"] = rec["tokens"] or len(times)
    if times:
        rec["ttft_s"] = times[0] - t0
        if rec["tokens"] > 1 and times[-1] > times[0]:
            rec["tpot_ms"] = (times[-1] - times[0]) * 1e3 / (rec["tokens"] - 1)
    return rec


async def level(base: str, workload: str, conc: int, max_tokens: int,
                model: str, first: int = 0) -> dict[str, Any]:
    """``conc`` requests at once, prompts ``first`` .. ``first + conc - 1`` of ``workload``."""
    import httpx

    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
        t0 = time.perf_counter()
        recs = await asyncio.gather(*(
            one(client, base + "/v1/completions", {**body, "prompt": prompt(workload, i)})
            for i in range(first, first + conc)))
        wall = time.perf_counter() - t0
    ok = [r for r in recs if r["error"] is None]
    drafted = sum((r["timings"] or {}).get("draft_n", 0) for r in ok)
    accepted = sum((r["timings"] or {}).get("draft_n_accepted", 0) for r in ok)

    def med(key: str) -> float | None:
        vals = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {"workload": workload, "concurrency": conc, "requests": conc,
            "failures": [r["error"] for r in recs if r["error"]],
            "tok_s": sum(r["tokens"] for r in ok) / wall, "ttft_s": med("ttft_s"),
            "tpot_ms": med("tpot_ms"), "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "texts": [r["text"] for r in recs]}


def run_config(cfg: dict[str, Any], args: argparse.Namespace, logdir: pathlib.Path,
               model: pathlib.Path) -> dict[str, Any]:
    extra = list(cfg["args"])
    if args.trace and cfg["server"] == "mlxcel":  # the engine's timeline, one file each
        extra += ["--engine-trace", str(logdir / f"{cfg['label']}.trace.jsonl")]
    argv, ready = server_argv(cfg["server"], model, parallel=max(args.concurrency),
                              extra=extra)
    # Granian's worker by 'spawn' on CUDA (see spawn_env)
    env = spawn_env(logdir) if cfg["server"] == "mlxcel" and args.mlxcel_spawn else None
    srv = Server(cfg["server"], argv, ready, logdir, cfg["label"], env=env)
    out: dict[str, Any] = {"label": cfg["label"], "server": cfg["server"], "args": cfg["args"],
                           "levels": []}
    try:
        srv.start()
        out["startup_s"] = srv.wait_ready()
        name = str(model)
        asyncio.run(level(srv.base, "fresh", 1, 8, name))  # warm-up
        for workload in args.workloads:
            for conc in args.concurrency:
                if cfg["server"] != "mlxcel" and conc not in args.peer_concurrency:
                    continue
                if args.level_warmup:  # other prompts, untimed (module docstring)
                    asyncio.run(level(srv.base, workload, conc, args.max_tokens, name,
                                      first=1000))
                rec = asyncio.run(level(srv.base, workload, conc, args.max_tokens, name))
                out["levels"].append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "texts"}
                                 | {"label": cfg["label"]}), flush=True)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"{cfg['label']}: {out['error']}", file=sys.stderr, flush=True)
    finally:
        srv.stop()
    return out


def compare(runs: list[dict[str, Any]]) -> None:
    """Each level's speed-up over its server's ``off`` run and whether its outputs match."""
    base = {r["server"]: r for r in runs if r["label"].endswith("off")}
    for r in runs:
        ref = base.get(r["server"])
        if ref is None or ref is r:
            continue
        by = {(lv["workload"], lv["concurrency"]): lv for lv in ref["levels"]}
        for lv in r["levels"]:
            b = by.get((lv["workload"], lv["concurrency"]))
            if b is None:
                continue
            lv["speedup"] = lv["tok_s"] / b["tok_s"] if b["tok_s"] else None
            lv["identical"] = lv["texts"] == b["texts"]


def render_md(doc: dict[str, Any]) -> str:
    lines = ["| config | workload | c | tok/s | vs off | acceptance | TPOT p50 ms | "
             "TTFT p50 ms | identical | failures |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        if r.get("error"):
            lines.append(f"| {r['label']} | error: {r['error'][:120]} | | | | | | | | |")
        for lv in r["levels"]:
            def f(v: Any, fmt: str) -> str:
                return "-" if v is None else format(v, fmt)
            ttft = None if lv["ttft_s"] is None else lv["ttft_s"] * 1e3
            lines.append(
                f"| {r['label']} | {lv['workload']} | {lv['concurrency']} | {lv['tok_s']:.1f} | "
                f"{f(lv.get('speedup'), '.2f')} | {f(lv['acceptance'], '.2f')} | "
                f"{f(lv['tpot_ms'], '.2f')} | {f(ttft, '.0f')} | "
                f"{ {True: 'yes', False: 'NO', None: '-'}[lv.get('identical')] } | "
                f"{len(lv['failures'])} |")
    return "\n".join(lines) + "\n"


def configs(args: argparse.Namespace, draft: pathlib.Path | None,
            self_draft: pathlib.Path | None) -> list[dict[str, Any]]:
    n = str(args.draft_max)
    table = {
        "mlxcel-off": ("mlxcel", ["--prompt-lookup", "off"]),
        # a second server without speculation: its "identical" column is the floor, how
        # often batched greedy output differs between two runs of the same server
        "mlxcel-off-again": ("mlxcel", ["--prompt-lookup", "off"]),
        "mlxcel-lookup": ("mlxcel", ["--prompt-lookup", "auto", "--draft-max", n]),
        "mlxcel-lookup-on": ("mlxcel", ["--prompt-lookup", "on", "--draft-max", n]),
        "mlxcel-draft": ("mlxcel", ["-md", str(draft), "--draft-max", n]),
        "mlxcel-self": ("mlxcel", ["-md", str(self_draft), "--draft-max", n]),
        "mlx_lm-off": ("mlx_lm", []),
        "mlx_lm-draft": ("mlx_lm", ["--draft-model", str(draft), "--num-draft-tokens", n]),
        "mlx_lm-self": ("mlx_lm", ["--draft-model", str(self_draft), "--num-draft-tokens", n]),
    }
    return [{"label": k, "server": table[k][0], "args": table[k][1]} for k in args.configs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="30m",
                    help="a bench checkpoint name (mlxcel.testing.bench_checkpoints), a "
                         "bench/gpu/build_checkpoint.py preset, or a path")
    ap.add_argument("--draft-preset", default="tiny-draft",
                    help="the draft model: a build_checkpoint preset with the target's vocab")
    ap.add_argument("--truncate", type=int, default=2, help="layers of the self-draft copy")
    ap.add_argument("--configs", type=lambda s: s.split(","),
                    default="mlxcel-off,mlxcel-lookup,mlxcel-draft,mlxcel-self,"
                            "mlx_lm-off,mlx_lm-draft,mlx_lm-self".split(","))
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["copy", "fresh"])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 8, 64])
    ap.add_argument("--peer-concurrency", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1], help="the levels mlx_lm.server runs (it drafts at batch 1)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--no-level-warmup", dest="level_warmup", action="store_false",
                    help="time each level's first run (no untimed run before it)")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--mlxcel-spawn", action="store_true",
                    help="start Granian's worker with 'spawn' (the CUDA workaround)")
    ap.add_argument("--trace", action="store_true",
                    help="write each mlxcel server's engine trace into the log folder")
    ap.add_argument("--out", default="bench/results/speculative_gpu.json")
    args = ap.parse_args(argv)

    from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint

    def build(name: str) -> pathlib.Path:
        """A path, a bench checkpoint name, or a bench/gpu/build_checkpoint.py preset (built
        by that script, which prints the path last)."""
        if pathlib.Path(name).exists():
            return pathlib.Path(name)
        if name in CHECKPOINTS:
            kw = dict(CHECKPOINTS[name])
            return bench_checkpoint(kw.pop("shape"), cache_dir=args.cache_dir, **kw)
        script = pathlib.Path(__file__).resolve().parent / "gpu" / "build_checkpoint.py"
        argv = [sys.executable, str(script), "--preset", name]
        argv += ["--cache-dir", args.cache_dir] if args.cache_dir else []
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        return pathlib.Path(done.stdout.strip().splitlines()[-1])

    t = time.perf_counter()
    target = build(args.target)
    need_draft = any("draft" in c for c in args.configs)
    draft = build(args.draft_preset) if need_draft else None
    self_draft = (truncated_copy(target, args.truncate,
                                 target.with_name(target.name + f"-first{args.truncate}"))
                  if any("self" in c for c in args.configs) else None)
    print(f"checkpoints ready in {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-spec-"))
    doc = {"target": args.target, "draft": args.draft_preset, "truncate": args.truncate,
           "max_tokens": args.max_tokens, "draft_max": args.draft_max,
           "machine": machine(), "versions": versions(), "runs": [], "logs": str(logdir)}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for cfg in configs(args, draft, self_draft):  # saved after each: a cut-off run keeps its part
        doc["runs"].append(run_config(cfg, args, logdir, target))
        compare(doc["runs"])
        out.write_text(json.dumps(doc, indent=1))
        out.with_suffix(".md").write_text(render_md(doc))
    print(render_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
