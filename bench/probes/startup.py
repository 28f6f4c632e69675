"""Time-to-ready: how long mlxcel-server takes from its start to ``/health`` 200, and what
the first requests then see, for source trees side by side on one checkpoint.

Each start (``--order``, e.g. ``after,before,after``: the first start of a fresh machine
also pays MLX's kernel compiles, which later starts read from its on-disk cache) runs
one server alone and measures:

- ``ready_s``: the process started -> ``/health`` answers 200;
- ``first``: one streamed request right after (its TTFT);
- ``burst1``: at once, C streams of one request each (``--burst``; a burst that meets
  the prefill shapes a background warm-up may not have reached yet), aggregate tok/s;
- ``burst2``: the same again, once the first has ended;
- the server's ``engine_warmup`` log lines;
- ``timeline``: seconds from the process start to the first log line of each of
  ``TIMELINE``'s events (the HTTP server up: its first ``/health`` answer; the model
  loaded; the engine set up; the lone-request warm-up done; the later shapes done), read
  from the log's timestamps, so each phase of the start shows where its time goes.

``--hide torch`` runs the servers as where torch is not installed (transformers imports it
whenever it finds it, and a GPU machine's image often carries it); ``--kernel-cache DIR``
gives every start one MLX kernel folder, so that only the first start compiles.

Variants are source trees (``--variant NAME=PATH``, PATH the tree's ``core/src``), put first
on the server's PYTHONPATH, so a commit is compared with another in one run. Clients and
rules are ``bench/serving.py``'s (greedy, ``ignore_eos``, a unique prompt per request).

    python bench/probes/startup.py --model /tmp/ckpt --label tiny --parallel 8 --burst 8 \\
        --variant after=core/src --variant before=/tmp/old/core/src --order after,before \\
        --out /tmp/startup.json                        # CPU dry run
    BEFORE=/tmp/src-old OUT=/tmp/st bash bench/gpu/startup.sh   # the device run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import pathlib
import sys
import tempfile
import time

from mlxcel.testing import bench_report
from mlxcel.testing.servers import (
    Server,
    loadavg,
    machine,
    server_argv,
    versions,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEVEL_KEYS = ("agg_tok_s", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "tpot_p50_ms", "ok",
              "failures", "failure_details",
              "failed", "wall_s")


# bench/serving.py, registered under one name at import, so its client processes (spawned:
# they import this script first) unpickle its functions
run_level = bench_report.harness(ROOT / "bench" / "serving.py", "bench_serving").run_level


TIMELINE = {"http_up": "route=/health", "model_loaded": "model_loaded",
            "engine_batch": "engine_batch", "warmup": "engine_warmup ",
            "warmup_done": "engine_warmup_done"}


def timeline(log: pathlib.Path, started: float) -> dict[str, float]:
    """Seconds from ``started`` (epoch) to the first line of each ``TIMELINE`` event."""
    out: dict[str, float] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        for name, word in TIMELINE.items():
            if name in out or word not in line:
                continue
            try:
                at = dt.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
            except (ValueError, IndexError):
                continue
            out[name] = round(at.timestamp() - started, 2)
    return out


def _site(args: argparse.Namespace, logdir: pathlib.Path) -> str | None:
    """A folder with a ``sitecustomize`` for the server: multiprocessing spawned
    (``--mlxcel-spawn``, serving.py's CUDA workaround) and the ``--hide`` modules made
    not importable, as where they are not installed (``importlib.util.find_spec`` then
    answers None: transformers imports torch whenever it finds it)."""
    lines = [f"sys.modules[{name!r}] = None" for name in args.hide]
    if args.mlxcel_spawn:
        lines.append("multiprocessing.set_start_method('spawn', force=True)")
    if not lines:
        return None
    site = logdir / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import multiprocessing, sys\n" + "\n".join(lines)
                                           + "\n")
    return str(site)


def one_start(name: str, src: str, args: argparse.Namespace, logdir: pathlib.Path,
              tag: str) -> dict:
    argv, ready = server_argv("mlxcel", args.model, args.parallel, None, args.mlxcel_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(src), _site(args, logdir),
                                                      env.get("PYTHONPATH")]))
    if args.kernel_cache:  # one folder for every start: only the first compiles
        env["MLX_PTX_CACHE_DIR"] = os.path.abspath(args.kernel_cache)
    srv = Server("mlxcel", argv, ready, logdir, tag, env, cwd=ROOT)
    timeout = {"connect": 10.0, "read": 300.0}
    out: dict = {"variant": name, "src": src, "loadavg_before": loadavg()}
    started = time.time()
    srv.start()
    try:
        out["ready_s"] = round(srv.wait_ready(args.startup_timeout), 2)
        first = run_level(srv.base, "mlxcel", f"{tag}-first", 1, 1, args.first_tokens, 1,
                          120.0, timeout)
        out["first_ttft_ms"] = first["ttft_p50_ms"]
        procs = max(1, math.ceil(args.burst / 16))
        for key in ("burst1", "burst2"):
            st = run_level(srv.base, "mlxcel", f"{tag}-{key}", args.burst, args.burst,
                           args.burst_tokens, procs, 300.0, timeout)
            out[key] = {k: st[k] for k in LEVEL_KEYS}
        out["alive"] = srv.alive()
    except BaseException:
        print(f"--- {tag} log tail ---\n{srv.log_tail()}", file=sys.stderr)
        raise
    finally:
        srv.stop()
        out["warmup_log"] = srv.log_grep("engine_warmup")
        out["timeline"] = timeline(srv.log_path, started)
        out["loadavg_after"] = loadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME=PATH (core/src)")
    ap.add_argument("--order", required=True, help="variant names, comma-separated")
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--burst", type=int, default=64)
    ap.add_argument("--burst-tokens", type=int, default=128)
    ap.add_argument("--first-tokens", type=int, default=16)
    ap.add_argument("--mlxcel-args", type=lambda s: s.split(), default=[])
    ap.add_argument("--mlxcel-spawn", action="store_true",
                    help="Granian's worker spawned, not forked (serving.py's CUDA workaround)")
    ap.add_argument("--hide", action="append", default=[],
                    help="a module the server must not import (as if not installed)")
    ap.add_argument("--kernel-cache", default=None, help="MLX_PTX_CACHE_DIR for every start")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    variants = dict(v.split("=", 1) for v in args.variant)
    out = pathlib.Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {
        "machine": machine(), "versions": versions(), "entries": []}
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="mlxcel-bench-startup-"))
    for i, name in enumerate(args.order.split(",")):
        tag = f"{args.label}-{i}-{name}"
        print(f"[{dt.datetime.now():%T}] start {i}: {name}", flush=True)
        try:
            entry = one_start(name, variants[name], args, logdir, tag)
        except Exception as exc:  # one failed start is a result, not the end of the run
            entry = {"variant": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        entry |= {"label": args.label, "start": i, "model": args.model, "hidden": args.hide,
                  "parallel": args.parallel, "burst": args.burst,
                  "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        doc["entries"].append(entry)
        out.write_text(json.dumps(doc, indent=1))
        b1, b2 = entry.get("burst1", {}), entry.get("burst2", {})
        print(f"  ready {entry.get('ready_s')} s, first TTFT {entry.get('first_ttft_ms')} ms, "
              f"burst1 {b1.get('agg_tok_s')} tok/s, burst2 {b2.get('agg_tok_s')} tok/s"
              f"{', error ' + entry['error'] if 'error' in entry else ''}", flush=True)
        print(f"  timeline {entry.get('timeline')}", flush=True)
        for line in entry.get("warmup_log", []):
            print("   ", line[-300:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
