"""What does a new shape cost on this backend? First vs second call of the ops a serving
engine runs with shapes that change (batch size, prefill width, rows copied out).

For each op and a few fresh shapes: ms of the first evaluation, ms of an immediate repeat.
A big first/repeat gap means a per-shape plan or compilation (cuBLASLt heuristics, cuDNN
graphs, JIT kernels) that a server pays whenever traffic brings a new shape.

    python bench/gpu/first_shape.py [--out first_shape.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def timed(fn) -> float:
    import mlx.core as mx

    t = time.perf_counter()
    mx.eval(fn())
    return (time.perf_counter() - t) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    import mlx.core as mx

    dt = mx.bfloat16
    w = mx.random.normal((14336, 4096)).astype(dt)
    kv = mx.random.normal((64, 8, 512, 128)).astype(dt)
    mx.eval(w, kv)
    cases = {
        "matmul [M,4096]x[4096,14336]": lambda m: (
            lambda x=mx.random.normal((m, 4096)).astype(dt): x @ w.T),
        "sdpa prefill causal+pad mask [R,32,C,128] kv C": lambda m: (
            lambda q=mx.random.normal((m // 64 + 1, 32, 64, 128)).astype(dt),
            k=mx.random.normal((m // 64 + 1, 8, 64, 128)).astype(dt):
            mx.fast.scaled_dot_product_attention(
                q, k, k, scale=0.08,
                mask=mx.tril(mx.ones((64, 64), dtype=mx.bool_))[None, None])),
        "sdpa prefill causal [R,32,C,128]": lambda m: (
            lambda q=mx.random.normal((2, 32, m // 8, 128)).astype(dt),
            k=mx.random.normal((2, 8, m // 8, 128)).astype(dt):
            mx.fast.scaled_dot_product_attention(q, k, k, scale=0.08, mask="causal")),
        "gather rows of a KV buffer": lambda m: (
            lambda idx=mx.arange(m % 60 + 2): kv[idx]),
        "rope with per-row offsets": lambda m: (
            lambda x=kv[: m % 60 + 2, :, :64].reshape(m % 60 + 2, 512, 1, 128),
            off=mx.arange(m % 60 + 2) * 3: mx.fast.rope(x, 128, traditional=False,
                                                        base=5e5, scale=1.0, offset=off)),
    }
    doc: dict = {"device": str(mx.default_device()), "mlx": mx.__version__, "ms": {}}
    for name, make in cases.items():
        rows = []
        for m in (64 * 7 + 3, 64 * 9 + 5, 64 * 11 + 1, 64 * 13 + 7):
            fn = make(m)
            mx.eval([a for a in fn.__defaults__ if isinstance(a, mx.array)])
            first, again = timed(fn), timed(fn)
            rows.append([m, round(first, 2), round(again, 2)])
        doc["ms"][name] = rows
        print(f"{name:50s} " + "  ".join(f"m={m}: {a}->{b}" for m, a, b in rows), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
