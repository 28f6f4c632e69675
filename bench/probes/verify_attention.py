"""Where does a batch's speculative verify forward go on CUDA? (GPU probe, issue #32)

Three parts, each a table on stdout:

* ``--checkpoint PATH``: raw mlx-lm, one forward of k tokens for each of B rows after a
  200-token prefill (``KVCache``, causal mask), k = 1..17: what a verify forward costs
  without the engine.
* attention per layer for a chunk of C queries over L keys, left-padded rows, bf16,
  Llama-3-8B heads: the engine's varlen kernel (``mlxcel.engine.accel.varlen_attention``),
  the same chunk as grouped matmuls (defined here: each KV head's queries as the rows of
  one matmul), and MLX's own masked SDPA on a shape it has seen; then the grouped path
  with L growing by one per call, as a verify step's cache does.
* MLX's masked SDPA on a shape it has not seen against one it has (a cuDNN plan per
  shape).

    python bench/probes/verify_attention.py --checkpoint /tmp/bench-ckpts/llama-... --rows 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlxcel.engine.accel import varlen_attention as va

HQ, HKV, D = 32, 8, 128
SHAPES = ((1, 1, 800), (8, 1, 800), (64, 1, 800), (1, 17, 800), (8, 17, 800),
          (8, 17, 2000), (32, 17, 1000), (64, 5, 1000), (1, 76, 1700), (1, 11, 300))


def grouped(q: mx.array, k: mx.array, v: mx.array, scale: float, starts: mx.array) -> mx.array:
    b, hq, c, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    g = hq // hkv
    scores = ((q * scale).reshape(b, hkv, g * c, d) @ k.swapaxes(-1, -2))
    scores = scores.reshape(b, hkv, g, c, length)
    slot = mx.arange(length)
    mask = (slot >= starts[:, None, None]) & (slot <= (length - c + mx.arange(c))[:, None])
    scores = mx.where(mask[:, None, None], scores, mx.array(float("-inf"), scores.dtype))
    w = mx.softmax(scores, axis=-1, precise=True).reshape(b, hkv, g * c, length)
    return (w @ v).reshape(b, hq, c, d)


def ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        mx.eval(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def once(fn) -> float:
    t = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - t) * 1e3


def raw_verify(path: str, rows: int) -> None:
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(path)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.random.randint(100, 1000, (rows, 200)), cache=cache))
    print("| k | p50 ms |\n|---|---|")
    for k in (1, 2, 4, 8, 17):
        times = []
        for _ in range(12):
            y = mx.random.randint(100, 1000, (rows, k))
            mx.eval(y)
            times.append(once(lambda y=y: model(y, cache=cache)))
            for c in cache:
                c.trim(k)
        print(f"| {k} | {statistics.median(times[2:]):.2f} |", flush=True)


def attention() -> None:
    print("| B | C | L | kernel ms | grouped ms | MLX (seen) ms | grouped, new L ms |")
    print("|---|---|---|---|---|---|---|")
    for b, c, length in SHAPES:
        print("| " + " | ".join(map(str, (b, c, length))) + " | "
              + " | ".join(f"{t:.3f}" for t in chunk_costs(b, c, length)) + " |", flush=True)


def chunk_costs(b: int, c: int, length: int) -> tuple[float, ...]:
    q = mx.random.normal((b, HQ, c, D)).astype(mx.bfloat16)
    k = mx.random.normal((b, HKV, length, D)).astype(mx.bfloat16)
    v = mx.random.normal((b, HKV, length, D)).astype(mx.bfloat16)
    starts = mx.array([(37 * i) % (length // 4) for i in range(b)], dtype=mx.int32)
    slot = mx.arange(length)
    mask = ((slot >= starts[:, None, None])
            & (slot <= (length - c + mx.arange(c))[:, None]))[:, None]
    mx.eval(q, k, v, starts, mask)
    kernel = (ms(lambda: va.varlen_decode_attention(q, k, v, 0.088, starts))
              if va.available() and va.supports(q, k, v) else float("nan"))
    group = ms(lambda: grouped(q, k, v, 0.088, starts))
    own = ms(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088, mask=mask))
    new_l = statistics.median(
        once(lambda n=n: grouped(q, k[:, :, :n], v[:, :, :n], 0.088, starts))
        for n in range(length - 5, length))
    return kernel, group, own, new_l


def sdpa_plans() -> None:
    print("| head dim | C | new shape p50 ms | seen ms |\n|---|---|---|---|")
    for d, hq, hkv in ((128, 32, 8), (256, 8, 2)):
        for c in (76, 512):
            new, seen = [], []
            for i in range(6):
                length = 30000 + 517 * i + c
                q = mx.random.normal((1, hq, c, d)).astype(mx.bfloat16)
                k = mx.random.normal((1, hkv, length, d)).astype(mx.bfloat16)
                m = mx.ones((1, 1, c, length), dtype=mx.bool_)
                mx.eval(q, k, m)

                def run(q=q, k=k, m=m):
                    return mx.fast.scaled_dot_product_attention(q, k, k, scale=0.06, mask=m)
                new.append(once(run))
                seen.append(once(run))
            print(f"| {d} | {c} | {statistics.median(new):.1f} | "
                  f"{statistics.median(seen):.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a text checkpoint for the raw verify table")
    ap.add_argument("--rows", type=int, default=8)
    args = ap.parse_args()
    if args.checkpoint:
        raw_verify(args.checkpoint, args.rows)
    attention()
    sdpa_plans()


if __name__ == "__main__":
    main()
