"""Device memory per prefill step of one long prompt: mlxcel's engine vs mlx-lm's loop.

A diagnostic for long-prompt prefill on the GPU. One variant per process (so each starts
from an empty device): ``mlxcel`` runs an ``EngineWorker`` (the device's own policy, no
warm-up) on a ``bench_checkpoints`` checkpoint and records, after every engine step,
MLX's active, cache and per-step peak memory and the device's used memory
(``nvidia-smi``); ``mlxcel-held`` is the same with the buffer cache kept through the
prefill (``BufferRelease.held_bytes`` unbounded), as the engine did before; ``mlx_lm`` runs ``mlx_lm.generate.generate_step`` on the same prompt and
checkpoint, with the same prefill step, and records the same after the prefill.

    python bench/gpu/prefill_memory.py --checkpoint gemma4-e4b --tokens 32768 \
        --variants mlxcel,mlx_lm --out /tmp/prefill_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GB = 1e9


def device_used() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        return round(float(out[0]) / 1024, 2) if out else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def sample(mx, step: int, started: float) -> dict:
    return {"step": step, "s": round(time.time() - started, 2),
            "active_gb": round(mx.get_active_memory() / GB, 2),
            "cache_gb": round(mx.get_cache_memory() / GB, 2),
            "peak_gb": round(mx.get_peak_memory() / GB, 2), "device_gb": device_used()}


def prompt_of(n: int, path) -> list[int]:
    """``n`` ordinary ids of the checkpoint at ``path``'s vocabulary."""
    config = json.loads((path / "config.json").read_text())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    return [(i * 7919) % (vocab - 300) + 200 for i in range(n)]


def run_mlxcel(path, tokens: int, chunk: int, cache_gb: int, variant: str) -> dict:
    import mlx.core as mx
    from mlxcel.testing.engine import submit, worker_for

    worker = worker_for(path, cache=cache_gb << 30 if cache_gb else False, chunk=chunk,
                        warm_up=False)
    if variant == "mlxcel-held":  # the buffer cache only goes back once idle
        worker.buffers.held_bytes = float("inf")
    started = time.time()
    sink = submit(worker, prompt_of(tokens, path), max_tokens=2)
    steps = []
    for i in range(100000):
        if sink.done:
            break
        mx.reset_peak_memory()
        worker.step()
        steps.append(sample(mx, i, started))
    last = sink.events[-1] if sink.events else None
    return {"steps": steps, "error": getattr(last, "error", None),
            "finish": getattr(last, "finish_reason", None)}


def run_mlx_lm(path, tokens: int, chunk: int) -> dict:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(path))
    started = time.time()
    mx.reset_peak_memory()
    error = None
    try:
        for _ in generate_step(mx.array(prompt_of(tokens, path)), model,
                               max_tokens=2, prefill_step_size=chunk):
            pass
    except RuntimeError as exc:
        error = str(exc)
    return {"steps": [sample(mx, 0, started)], "error": error}


def child(args) -> None:
    from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint

    kw = dict(CHECKPOINTS[args.checkpoint])  # where bench/prompt_cache.py builds it too
    path = bench_checkpoint(kw.pop("shape"), cache_dir=args.checkpoint_dir, **kw)
    if args.variant == "build":
        result = {"steps": [], "error": None}
    elif args.variant.startswith("mlx_lm"):
        result = run_mlx_lm(path, args.tokens, args.chunk)
    else:
        result = run_mlxcel(path, args.tokens, args.chunk, args.cache_gb, args.variant)
    print("RESULT " + json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="gemma4-e4b")
    ap.add_argument("--checkpoint-dir", default="/tmp/bench-ckpts")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--cache-gb", type=int, default=32)
    ap.add_argument("--variants", default="mlxcel,mlx_lm")
    ap.add_argument("--variant")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.variant:
        return child(args)
    results = {}
    for spec in ["build", *args.variants.split(",")]:
        # a variant: name[+ENV=VALUE...][@chunk]
        name, _, chunk = spec.partition("@")
        name, *envs = name.split("+")
        env = dict(os.environ, **dict(e.split("=", 1) for e in envs))
        cmd = [sys.executable, __file__, "--variant", name, "--checkpoint", args.checkpoint,
               "--checkpoint-dir", args.checkpoint_dir, "--tokens", str(args.tokens),
               "--chunk", chunk or str(args.chunk), "--cache-gb", str(args.cache_gb)]
        started = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(lines[-1][7:]) if lines else {"error": proc.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            res = {"error": "timeout"}
        res["wall_s"] = round(time.time() - started, 1)
        if spec == "build":
            print(f"checkpoint built in {res['wall_s']} s; error={res.get('error')}")
            continue
        results[spec] = res
        steps = res.get("steps") or []
        peak = max((s["peak_gb"] for s in steps), default=None)
        dev = max((s["device_gb"] or 0 for s in steps), default=None)
        print(f"{spec}: steps={len(steps)} max_peak_gb={peak} max_device_gb={dev} "
              f"error={str(res.get('error'))[:300]} wall={res['wall_s']}", flush=True)
        for s in steps[:: max(1, len(steps) // 12)]:
            print("   ", s, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
