"""Where a raw decode step's wall time goes on the host: building the graph in Python,
``mx.async_eval`` (on CUDA this encodes the kernels), and waiting for the result.

    python bench/gpu/step_split.py --model CKPT --batch 64 --steps 64 [--ragged]
        [--attention grouped|varlen]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from raw_loop import make_cache


def timed_steps(model, cache, y, n: int, skip: int = 0) -> tuple[list, list, list]:
    """``n`` pipelined greedy decode steps after ``skip`` untimed ones: per step, seconds
    to build the graph, to ``mx.async_eval`` it and to wait for the previous step."""
    import mlx.core as mx

    build, encode, wait = [], [], []
    prev = None
    for i in range(n + skip):
        t0 = time.perf_counter()
        nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
        t1 = time.perf_counter()
        mx.async_eval(nxt)
        t2 = time.perf_counter()
        if prev is not None:
            prev.tolist()
        t3 = time.perf_counter()
        if i >= skip:
            build.append(t1 - t0)
            encode.append(t2 - t1)
            wait.append(t3 - t2)
        prev, y = nxt, nxt
    return build, encode, wait


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--cache", default="mlxcel-shared")
    ap.add_argument("--ragged", action="store_true")
    ap.add_argument("--attention", default=None, help="grouped | varlen (mlxcel's paths)")
    args = ap.parse_args()
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(args.model)
    if args.attention:
        from mlxcel.engine import attention

        args.attention = attention.install(model, enable=True, choice=args.attention)
    pads = [(i % 16) if args.ragged else 0 for i in range(args.batch)]
    cache = make_cache(model, args.cache, pads)
    y = mx.argmax(model(mx.random.randint(300, 400, (args.batch, 48)), cache=cache)[:, -1],
                  axis=-1)
    mx.eval(y)
    build, encode, wait = timed_steps(model, cache, y, args.steps, skip=8)
    med = {k: statistics.median(v) * 1e3 for k, v in
           (("build", build), ("async_eval", encode), ("wait", wait))}
    print(f"{args.cache} B={args.batch} ragged={args.ragged} attention={args.attention}: " +
          "  ".join(f"{k} {v:.2f} ms" for k, v in med.items()) +
          f"  step {sum(med.values()):.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
