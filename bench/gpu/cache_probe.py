"""Where does a batched KV cache lose to KVCache at large batch? Raw decode loop variants.

Same pipelined greedy loop as raw_loop.py on one checkpoint, one variant after another:
plain ``KVCache``; mlx-lm's ``BatchKVCache`` with no row padded and with ragged rows (row i
left-padded by i % 16, so every step needs a mask); mlxcel's engine cache
(``mlxcel.engine.kvcache.BatchCache``) with ragged rows in absolute-position mode (per-row
RoPE offsets, like BatchKVCache) and in shared-position mode (one scalar offset), shared
mode with no row padded (no mask at all), and both modes with ragged rows through
``mlxcel.engine.attention``'s grouped decode attention or its one-kernel varlen path
(``mlxcel.engine.varlen_attention``, CUDA) instead of MLX's masked SDPA.

    python bench/gpu/cache_probe.py --model CKPT --batch 64 --steps 128 [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from raw_loop import measure

VARIANTS = [("KVCache", False, None), ("BatchKVCache", False, None),
            ("BatchKVCache", True, None), ("mlxcel-absolute", True, None),
            ("mlxcel-shared", True, None), ("mlxcel-shared", False, None),
            ("mlxcel-absolute", True, "grouped"), ("mlxcel-shared", True, "grouped"),
            ("mlxcel-shared", True, "varlen")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--out")
    args = ap.parse_args()
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(args.model)
    results = {"device": str(mx.default_device()), "mlx": mx.__version__, "batch": args.batch,
               "steps": args.steps, "ms_per_step": {}}
    for kind, ragged, attention in VARIANTS:
        r = measure(model, kind, args.batch, 48, args.steps, 8, ragged=ragged,
                    attention=attention)
        results["ms_per_step"][r["cache"]] = round(r["ms_per_step"], 2)
        print(f"{r['cache']:28s} {r['ms_per_step']:7.2f} ms/step  {r['tok_s']:8.1f} tok/s",
              flush=True)
    print(json.dumps(results))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
