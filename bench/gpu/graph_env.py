"""A decode step's host time under MLX's CUDA graph settings (each in a fresh process).

MLX's CUDA backend records kernels into CUDA graphs of at most ``MLX_MAX_OPS_PER_BUFFER``
nodes (default 20), keeps instantiated graphs in a cache keyed by topology and clears the
whole cache once it holds more than ``MLX_CUDA_GRAPH_CACHE_SIZE`` (default 100) graphs.
This runs ``step_split.py`` (mlxcel's cache, ragged rows, varlen attention) per setting.

    python bench/gpu/graph_env.py --model CKPT [--batch 64] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

SETTINGS = [(None, None), ("50", None), ("100", None), ("200", None), (None, "1000"),
            ("100", "1000"), (None, None)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    here = pathlib.Path(__file__).resolve().parent
    for ops, cache in SETTINGS:
        env = dict(os.environ)
        for key, value in (("MLX_MAX_OPS_PER_BUFFER", ops), ("MLX_CUDA_GRAPH_CACHE_SIZE", cache)):
            env.pop(key, None)
            if value is not None:
                env[key] = value
        out = subprocess.run(
            [sys.executable, str(here / "step_split.py"), "--model", args.model, "--batch",
             str(args.batch), "--steps", str(args.steps), "--ragged", "--attention", "varlen"],
            env=env, capture_output=True, text=True, cwd=here)
        line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
        print(f"ops/buffer {ops or 'default':>7}  graph cache {cache or 'default':>7}:  {line}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
