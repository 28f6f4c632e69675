"""Check and time mlxcel's one-kernel varlen decode attention on the GPU (CUDA only).

Compiles ``mlxcel.engine.varlen_attention``'s kernel, runs its self-check (printing any
compile error in full), compares it with MLX's masked SDPA on a Llama-3-8B-shaped decode
step (bf16, B rows left-padded by i % 16, Hq 32, Hkv 8, D 128), and times one step's
worth of attention (32 layers) for: MLX's fused SDPA without a mask (the unpadded
reference), MLX's masked SDPA, mlxcel's grouped path and the varlen kernel.

    python bench/gpu/varlen_check.py [--batch 64] [--length 300] [--out varlen.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()
    import mlx.core as mx
    from mlxcel.engine import varlen_attention as va
    from mlxcel.engine.attention import grouped_decode_attention

    doc: dict = {"device": str(mx.default_device()), "mlx": mx.__version__}
    try:
        doc["self_check"] = va._self_check()
    except Exception:
        doc["self_check"] = "error: " + traceback.format_exc()
    print("self-check:", doc["self_check"], flush=True)
    if doc["self_check"] is not True:
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        return 1
    b, hq, hkv, d, n = args.batch, 32, 8, 128, args.length
    cap = (n + 255) // 256 * 256
    q = mx.random.normal((b, 1, hq, d)).astype(mx.bfloat16).transpose(0, 2, 1, 3)
    k = mx.random.normal((b, hkv, cap, d)).astype(mx.bfloat16)[..., :n, :]
    v = mx.random.normal((b, hkv, cap, d)).astype(mx.bfloat16)[..., :n, :]
    starts = mx.array([i % 16 for i in range(b)], dtype=mx.int32)
    mask = (mx.arange(n)[None, :] >= starts[:, None])[:, None, None, :]
    scale = d ** -0.5
    got = va.varlen_decode_attention(q, k, v, scale, starts).astype(mx.float32)
    want = va.reference(q, k, v, scale, starts).astype(mx.float32)
    doc["max_abs_err_vs_mlx_masked"] = mx.abs(got - want).max().item()
    print("max |varlen - mlx masked| =", doc["max_abs_err_vs_mlx_masked"], flush=True)
    paths = {
        "mlx fused, no mask (unpadded reference)":
            lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale),
        "mlx masked": lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                   mask=mask),
        "mlxcel grouped": lambda: grouped_decode_attention(q, k, v, scale, mask),
        "mlxcel varlen": lambda: va.varlen_decode_attention(q, k, v, scale, starts),
    }
    doc["ms_per_32_layers"] = {}
    for name, fn in paths.items():
        mx.eval([fn() for _ in range(32)])
        t = time.perf_counter()
        for _ in range(args.reps):
            mx.eval([fn() for _ in range(32)])
        ms = (time.perf_counter() - t) / args.reps * 1e3
        doc["ms_per_32_layers"][name] = round(ms, 3)
        print(f"{name:42s} {ms:8.3f} ms per 32 calls (B={b}, L={n})", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
