"""MLX on Linux CPU: reference BLAS vs OpenBLAS, bfloat16 vs float32 (what --dtype auto and
the server's OpenBLAS re-exec are based on).

For each BLAS (MLX's bundled netlib reference; OpenBLAS via LD_PRELOAD, when installed) a
child process measures
  * GEMM GFLOP/s (n x n @ n x n) in float32 and bfloat16, and
  * raw decode tok/s of a ~30M-parameter random qwen3 checkpoint with mlx_lm's model
    called directly (no server): B=1 with make_prompt_cache, and B=16 with a [16, 1]
    input and a fresh KVCache list; bfloat16 (the checkpoint's dtype), float32, and a
    4-bit quantized copy with bfloat16 vs float32 scales.
Prints a markdown report and writes it to bench/results/blas_check.md.

    .venv/bin/python bench/probes/blas_check.py [--steps 32] [--gemm-n 1024]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CKPT = {"hidden_size": 512, "num_layers": 8, "vocab_size": 8192, "suppress_eos": True}
PROMPT_LEN = 16


def gemm_gflops(n: int, dtype: str, reps: int = 5) -> float:
    import mlx.core as mx

    a = mx.random.normal((n, n)).astype(getattr(mx, dtype))
    b = mx.random.normal((n, n)).astype(getattr(mx, dtype))
    mx.eval(a, b, a @ b)
    t = time.perf_counter()
    for _ in range(reps):
        mx.eval(a @ b)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def decode_tok_s(path: pathlib.Path, dtype: str | None, batch: int, steps: int,
                 max_seconds: float) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    if dtype:
        model.set_dtype(getattr(mx, dtype))
    model.eval()
    cache = make_prompt_cache(model) if batch == 1 else [KVCache() for _ in model.layers]
    prompt = mx.random.randint(0, 8000, (batch, PROMPT_LEN))
    tok = mx.argmax(model(prompt, cache=cache)[:, -1], axis=-1)
    mx.eval(tok)
    for _ in range(3):  # warm-up
        tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
        mx.eval(tok)
    t = time.perf_counter()
    done = 0
    while done < steps and (done < 3 or time.perf_counter() - t < max_seconds):
        tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
        mx.eval(tok)
        done += 1
    return batch * done / (time.perf_counter() - t)


def child(args: argparse.Namespace) -> None:
    """Runs under one BLAS; prints one JSON line."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model
    from mlxcel.backend import blas_in_use
    from mlxcel.testing.checkpoint import cached_checkpoint

    plain = cached_checkpoint("qwen3", **CKPT)
    q4 = cached_checkpoint("qwen3", quantize_bits=4, **CKPT)
    model, _ = load_model(plain)
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    mx.eval(mx.ones((2, 2)) @ mx.ones((2, 2)))
    out: dict = {"blas": blas_in_use(), "params": params, "gemm": {}, "decode": {}}
    for dtype in ("float32", "bfloat16"):
        out["gemm"][dtype] = gemm_gflops(args.gemm_n, dtype)
    for name, path, dtype in (("bfloat16", plain, None), ("float32", plain, "float32"),
                              ("q4 bfloat16 scales", q4, None),
                              ("q4 float32 scales", q4, "float32")):
        for batch in (1, 16):
            out["decode"][f"{name}|{batch}"] = decode_tok_s(path, dtype, batch, args.steps,
                                                             args.max_seconds)
    print(json.dumps(out))


def run_child(args: argparse.Namespace, preload: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "MLXCEL_FAST_BLAS_REEXEC")}
    if preload:
        env["LD_PRELOAD"] = preload
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps),
           "--gemm-n", str(args.gemm_n), "--max-seconds", str(args.max_seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per case")
    parser.add_argument("--max-seconds", type=float, default=15,
                        help="stop a decode case early after this long (at least 3 steps)")
    parser.add_argument("--gemm-n", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate reference/OpenBLAS children this often; best of each")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "blas_check.md"))
    args = parser.parse_args()
    if args.child:
        return child(args)
    import mlx.core as mx
    from mlxcel.backend import find_fast_blas

    fast = find_fast_blas()
    load_before = os.getloadavg()[0]
    runs: dict[str, dict] = {}
    for _ in range(args.rounds):  # alternate the BLAS; keep each case's best (least disturbed)
        for name, preload in (("reference", None), ("openblas", fast)):
            if name == "openblas" and not fast:
                continue
            new = run_child(args, preload)
            old = runs.setdefault(name, new)
            for part in ("gemm", "decode"):
                old[part] = {k: max(v, new[part][k]) for k, v in old[part].items()}
    ref = runs["reference"]
    cols = list(runs)
    lines = [
        "# MLX CPU: reference BLAS vs OpenBLAS, bfloat16 vs float32",
        "",
        f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} - mlx "
        f"{mx.__version__}; {os.cpu_count()} CPUs, {platform.platform()}; "
        f"1-min load average {load_before:.2f} -> {os.getloadavg()[0]:.2f} (noisy if > 0.5)",
        "",
        "BLAS per column: " + "; ".join(f"{c}: `{runs[c]['blas']}`" for c in cols),
        "",
        f"## GEMM {args.gemm_n}x{args.gemm_n} @ {args.gemm_n}x{args.gemm_n}, GFLOP/s (best of "
        f"{args.rounds})",
        "",
        "| dtype | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for dtype in ("float32", "bfloat16"):
        lines.append(f"| {dtype} | " + " | ".join(f"{runs[c]['gemm'][dtype]:.1f}" for c in cols)
                     + " |")
    lines += [
        "",
        f"## Raw decode tok/s, qwen3 h{CKPT['hidden_size']} L{CKPT['num_layers']} "
        f"V{CKPT['vocab_size']} ({ref['params'] / 1e6:.1f}M parameters; untied, EOS rows zeroed)",
        "",
        f"Best of {args.rounds} alternating rounds per cell. "
        f"mlx_lm model called directly, greedy, {PROMPT_LEN}-token prompt, {args.steps} timed "
        f"steps (fewer if a case passes {args.max_seconds:g} s, at least 3) after 3 warm-up "
        "steps; tok/s = batch x steps / seconds. q4 = the same "
        "checkpoint quantized to 4 bits (group 64), scales/biases left bfloat16 or cast to "
        "float32.",
        "",
        "| weights | batch | " + " | ".join(cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for key in ref["decode"]:
        name, batch = key.split("|")
        lines.append(f"| {name} | {batch} | "
                     + " | ".join(f"{runs[c]['decode'][key]:.1f}" for c in cols) + " |")
    lines += ["", f"Reproduce: `.venv/bin/python bench/probes/blas_check.py --steps {args.steps} "
              f"--gemm-n {args.gemm_n} --max-seconds {args.max_seconds:g} --rounds {args.rounds}`", ""]
    text = "\n".join(lines)
    print(text)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
