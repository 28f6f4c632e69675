"""Raw MLX decode loop (no server): the ceiling the serving benchmark is compared with.

Loads the checkpoint with mlx-lm, prefills B random prompts of ``--prompt-len`` tokens,
then times ``--steps`` greedy decode steps of the whole batch, pipelined the way mlx-lm's
own generate loop is (step n+1 is queued with ``mx.async_eval`` before step n's tokens are
read back to Python). Once with the model's own caches (``KVCache``: mlx-lm's
``make_prompt_cache``, one plain cache per KV layer with batch dimension B;
``RotatingKVCache`` for sliding-window layers) and once with mlx-lm's batch caches
(``BatchKVCache``: a ``make_prompt_cache`` per row, merged layer by layer into
``BatchKVCache`` / ``BatchRotatingKVCache``, as mlx_lm.server's batch generator does; for a
Llama-shaped model that is the ``BatchKVCache(left_padding)`` of earlier runs). tok/s = B *
steps / time; the reference for a batch size is the faster of the two.

    python bench/gpu/raw_loop.py --model CKPT --batches 1,8,64 --steps 256 --out raw.json

A ``--caches`` entry ``KIND+PATH`` (e.g. ``BatchKVCache+varlen``) also times KIND with
mlxcel's masked decode attention PATH (``mlxcel.engine.accel.attention``); such variants
are reported but are not the reference.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def make_cache(model, cache_kind: str, pads: list[int]) -> list:
    """``KVCache`` | ``BatchKVCache`` (mlx-lm) | ``mlxcel-absolute`` | ``mlxcel-shared``
    (mlxcel's engine cache, ``mlxcel.engine.cache.kvcache``, one per layer: models without
    KV-shared layers only; shared = one scalar RoPE position)."""
    from mlx_lm.models.cache import make_prompt_cache

    if cache_kind == "KVCache":
        return make_prompt_cache(model)
    if cache_kind == "BatchKVCache":
        rows = [make_prompt_cache(model) for _ in pads]
        merged = [c.merge([row[i] for row in rows]) for i, c in enumerate(rows[0])]
        if any(pads):
            for c in merged:
                c.prepare(left_padding=pads)
        return merged
    from mlxcel.engine.cache.kvcache import BatchCache, shared_position_rope

    rope = shared_position_rope(model, True) if cache_kind == "mlxcel-shared" else None
    if cache_kind == "mlxcel-shared" and rope is None:
        raise SystemExit("this model cannot decode with shared positions")
    return [BatchCache(pads, rope) for _ in model.layers]


def measure(
    model,
    cache_kind: str,
    batch: int,
    prompt_len: int,
    steps: int,
    warmup: int,
    ragged: bool = False,
    attention: str | None = None,
) -> dict:
    """``ragged``: row i's prompt is left-padded by i % 16 tokens (a decode mask is needed);
    ``attention``: ``grouped`` / ``varlen`` = masked steps on mlxcel's cache take that path
    of mlxcel.engine.accel.attention (None: MLX's masked SDPA)."""
    if attention:
        from mlxcel.engine.accel import attention as paths

        attention = paths.install(model, enable=True, choice=attention)
    try:
        return _measure(model, cache_kind, batch, prompt_len, steps, warmup, ragged, attention)
    finally:
        if attention:
            paths.uninstall(model)


def _measure(model, cache_kind, batch, prompt_len, steps, warmup, ragged, attention) -> dict:
    import mlx.core as mx
    from mlxcel.testing.decode_loop import pipelined_greedy

    pads = [(i % 16) if ragged and cache_kind != "KVCache" else 0 for i in range(batch)]
    cache = make_cache(model, cache_kind, pads)
    prompt = mx.random.randint(300, 400, (batch, prompt_len)).astype(mx.uint32)

    def step(y):
        return mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1).astype(mx.uint32)

    t0 = time.perf_counter()
    y = mx.argmax(model(prompt, cache=cache)[:, -1, :], axis=-1).astype(mx.uint32)
    mx.eval(y)
    prefill_s = time.perf_counter() - t0
    for _ in range(warmup):
        y = step(y)
        mx.eval(y)
    t0 = time.perf_counter()
    pipelined_greedy(step, y, steps)
    dt = time.perf_counter() - t0
    kinds = sorted({type(c).__name__ for c in cache})
    cache.clear()
    mx.clear_cache()
    return {
        "cache": cache_kind
        + (" ragged" if ragged else "")
        + (f" {attention}" if attention else ""),
        "cache_types": kinds,
        "batch": batch,
        "steps": steps,
        "seconds": dt,
        "ms_per_step": dt / steps * 1e3,
        "tok_s": batch * steps / dt,
        "prefill_s": prefill_s,
        "prompt_len": prompt_len,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--caches", default="KVCache,BatchKVCache")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import mlx.core as mx
    from mlx_lm import load

    t = time.perf_counter()
    model, _ = load(args.model)
    load_s = time.perf_counter() - t
    print(f"loaded in {load_s:.1f}s on {mx.default_device()}", flush=True)
    runs = []
    for b in (int(x) for x in args.batches.split(",")):
        for entry in args.caches.split(","):
            kind, _, path = entry.partition("+")
            r = measure(model, kind, b, args.prompt_len, args.steps, args.warmup,
                        attention=path or None)
            runs.append(r)
            print(
                f"B={b:<3} {r['cache']:<22} {r['tok_s']:9.1f} tok/s  {r['ms_per_step']:7.2f} ms/step"
                f"  (prefill {r['prefill_s'] * 1e3:.0f} ms)",
                flush=True,
            )
    best: dict[str, dict] = {}
    for r in runs:
        if " " in r["cache"]:
            continue  # a variant (ragged rows, an attention path), not the reference
        k = str(r["batch"])
        if k not in best or r["tok_s"] > best[k]["tok_s"]:
            best[k] = r
    doc = {
        "model": args.model,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "load_s": load_s,
        "method": (
            f"mlx-lm model, greedy argmax, {args.steps} pipelined decode steps after "
            f"a {args.prompt_len}-token prefill and {args.warmup} warm-up steps; "
            "best of the model's caches (KVCache) / mlx-lm's merged batch caches "
            "(BatchKVCache)"
        ),
        "batches": best,
        "runs": runs,
    }
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
