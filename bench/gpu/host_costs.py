"""Two host-side costs behind the serving engine's step time on CUDA.

1. GIL: does building a graph with mlxcel's custom varlen kernel (``mx.fast.cuda_kernel``)
   or with the grouped path let another Python thread run? A side thread counts while the
   main thread builds 32 layers' worth of attention calls (no evaluation); its count rate
   is compared with its rate while the main thread sleeps (the GIL is then free).
2. Fresh device buffers: ms to evaluate the concatenation a batch join does (per layer,
   keys and values of B rows), with shapes never seen before vs the same shapes again.

    python bench/gpu/host_costs.py
"""

from __future__ import annotations

import sys
import threading
import time


def main() -> int:
    import mlx.core as mx
    from mlxcel.engine import varlen_attention as va
    from mlxcel.engine.attention import grouped_decode_attention

    count = [0]
    stop = [False]

    def spin() -> None:
        while not stop[0]:
            count[0] += 1

    side = threading.Thread(target=spin, daemon=True)
    side.start()
    b, n = 64, 300
    q = mx.random.normal((b, 1, 32, 128)).astype(mx.bfloat16).transpose(0, 2, 1, 3)
    k = mx.random.normal((b, 8, 512, 128)).astype(mx.bfloat16)[..., :n, :]
    starts = mx.array([i % 16 for i in range(b)], dtype=mx.int32)
    mask = (mx.arange(n)[None, :] >= starts[:, None])[:, None, None, :]
    mx.eval(q, k, starts, mask)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.2)
    idle_rate = (count[0] - c0) / (time.perf_counter() - t0)
    for name, fn in (("varlen", lambda: va.varlen_decode_attention(q, k, k, 0.08, starts)),
                     ("grouped", lambda: grouped_decode_attention(q, k, k, 0.08, mask))):
        for _ in range(3):
            c0, t0 = count[0], time.perf_counter()
            outs = [fn() for _ in range(32 * 20)]
            dt = time.perf_counter() - t0
            rate = (count[0] - c0) / dt
            print(f"build {name:8s}: {dt / 20 * 1e3:6.2f} ms per 32 calls; side thread ran at "
                  f"{rate / idle_rate:5.1%} of its idle rate", flush=True)
            mx.eval(outs)
    stop[0] = True
    for rows in (9, 17, 25, 9, 17, 25):
        parts = [mx.random.normal((rows, 8, 96, 128)).astype(mx.bfloat16) for _ in range(2)]
        mx.eval(parts)
        t0 = time.perf_counter()
        joined = [mx.concatenate(parts) for _ in range(64)]
        mx.eval(joined)
        print(f"64 joins of 2 x [{rows}, 8, 96, 128] bf16: "
              f"{(time.perf_counter() - t0) * 1e3:7.2f} ms", flush=True)
        del joined
    print("mlx cache limit", mx.get_cache_memory() if hasattr(mx, "get_cache_memory") else "?")
    return 0


if __name__ == "__main__":
    sys.exit(main())
