"""Two questions about an 8B-shaped step on the H200, on a random in-memory model (no
checkpoint):

1. Does ``mlxcel.engine.fused_proj`` (q/k/v and gate/up as one matmul each) shorten a decode
   step? Pipelined greedy steps (``step_split.timed_steps``) at B = 1, 8, 64 on mlx-lm's
   ``KVCache`` and on the engine's ragged ``BatchCache`` with the varlen attention, each
   with plain and fused projections, alternated over ``--rounds``; medians of build,
   ``mx.async_eval`` and wait per step.
2. What does a prefill group of G rows x 64 tokens cost (G = 8, 16, 32, 64): ms per group
   and per row, plain and fused.

    python bench/gpu/fuse_probe.py [--rounds 3] [--out fuse_probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from raw_loop import make_cache
from step_split import timed_steps

SHAPE = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32,
             intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
             rms_norm_eps=1e-5, vocab_size=128256, rope_theta=500000.0,
             tie_word_embeddings=False)


def build(fused: bool):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama

    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(**SHAPE))
    model.set_dtype(mx.bfloat16)
    model.update(nn.utils.tree_map(lambda p: (p * 0.02).astype(mx.bfloat16)
                                   if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    if fused:
        from mlxcel.engine import fused_proj

        assert fused_proj.fuse(model) == 2 * SHAPE["num_hidden_layers"]
    return model


def decode(model, batch: int, ragged: bool, steps: int) -> dict:
    import mlx.core as mx

    kind = "mlxcel-shared" if ragged else "KVCache"
    pads = [(i % 16) if ragged else 0 for i in range(batch)]
    cache = make_cache(model, kind, pads)
    y = mx.argmax(model(mx.random.randint(300, 400, (batch, 48)), cache=cache)[:, -1], axis=-1)
    mx.eval(y)
    build, encode, wait = timed_steps(model, cache, y, steps, skip=8)
    med = {k: statistics.median(v) * 1e3 for k, v in
           (("build", build), ("async_eval", encode), ("wait", wait))}
    med["step"] = sum(med.values())
    return med


def prefill(model, rows: int, reps: int = 5) -> float:
    import mlx.core as mx
    from mlxcel.engine.kvcache import BatchCache

    times = []
    for i in range(reps + 1):
        cache = [BatchCache([0] * rows) for _ in model.layers]
        toks = mx.random.randint(300, 400, (rows, 64))
        mx.eval(toks)
        t0 = time.perf_counter()
        model(toks, cache)
        mx.eval([c.state for c in cache])
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from mlxcel.engine import attention

    models = {"plain": build(False), "fused": build(True)}
    for m in models.values():
        attention.install(m, enable=True, choice="varlen")
    res: dict = {"decode": [], "prefill": []}
    for r in range(args.rounds):
        for b in [int(x) for x in args.batches.split(",")]:
            for ragged in (False, True):
                for name, m in models.items():
                    med = decode(m, b, ragged, args.steps)
                    res["decode"].append({"round": r, "B": b, "ragged": ragged, "proj": name,
                                          **med})
                    print(f"r{r} B={b:<3} {'ragged+varlen' if ragged else 'KVCache':<13} "
                          f"{name:<5} " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()),
                          flush=True)
    for g in (8, 16, 32, 64):
        for name, m in models.items():
            ms = prefill(m, g)
            res["prefill"].append({"rows": g, "proj": name, "ms": ms})
            print(f"prefill {g}x64 {name:<5} {ms:.1f} ms ({ms / g:.2f} ms/row)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
