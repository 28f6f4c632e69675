"""Prefill groups of a burst: is fresh device memory what makes them slow?

MLX's CUDA allocator takes every buffer it has no cached buffer of that size for from
``cudaMallocManaged``, and the GPU faults its pages in on first touch. In the c=64 trace,
groups of 8 rows x 64 columns took 50-76 ms while the same shapes took ~20 ms elsewhere.
This prefills 8 such groups back to back on mlxcel's cache, three ways: each group's cache
kept (a burst: every group needs fresh memory), each dropped before the next (its buffers
come back from MLX's cache), and kept but sized to the group's width instead of 256 slots.

    python bench/gpu/alloc_probe.py --model CKPT [--rows 8] [--cols 64] [--groups 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--groups", type=int, default=8)
    args = ap.parse_args()
    import mlx.core as mx
    from mlx_lm import load
    from mlxcel.engine import attention
    from mlxcel.engine.kvcache import BatchCache, shared_position_rope

    model, _ = load(args.model)
    attention.install(model)
    rope = shared_position_rope(model, True)
    layers = len(model.layers)

    def group(step: int) -> list:
        cache = [BatchCache([0] * args.rows, rope) for _ in range(layers)]
        for c in cache:
            c.step = step
        tokens = mx.random.randint(300, 400, (args.rows, args.cols)).astype(mx.uint32)
        model(tokens, cache=cache)
        mx.eval([c.state for c in cache])
        return cache

    group(256)  # compile / plan this shape once
    for label, step, keep in (("kept, 256 slots", 256, True), ("dropped, 256 slots", 256, False),
                              ("kept, width-sized", args.cols, True),
                              ("kept, 256 slots (again)", 256, True)):
        mx.clear_cache()
        held, times = [], []
        for _ in range(args.groups):
            t = time.perf_counter()
            cache = group(step)
            times.append((time.perf_counter() - t) * 1e3)
            if keep:
                held.append(cache)
            del cache
        print(f"{label:<26} per group ms: " + " ".join(f"{x:.1f}" for x in times)
              + f"  (median {statistics.median(times):.1f})", flush=True)
        del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
