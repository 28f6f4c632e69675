"""Probe: where does a warm prompt-cache turn's time go, mlxcel's engine vs mlx-lm's own
loop, with no HTTP? Turn 1 is a ~4k-token prompt; turn 2 extends it by ~190 tokens.
mlxcel: its engine in-process (``mlxcel.testing.engine``), the prompt cache on; mlx-lm:
``generate_step`` on a ``make_prompt_cache`` cache kept from turn 1 (what mlx_lm.server
does with its LRU cache). Time = turn 2 submitted -> its first token. Alternating runs,
medians.

    python bench/probes/warm_ttft.py [--shape 30m] [--tokens 4000] [--tail 190] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx


def prompts(vocab: int, n: int, tail: int, seed: int) -> tuple[list[int], list[int]]:
    import random

    rng = random.Random(seed)
    first = [rng.randrange(100, vocab - 100) for _ in range(n)]
    return first, first + [rng.randrange(100, vocab - 100) for _ in range(tail)]


async def first_token(engine, req) -> tuple[float, int]:
    """Seconds from submitting ``req`` to its first token; then the rest is read (a row that
    finishes is stored in the prompt cache before its finish event, which a streamed turn's
    first token does not wait for), and the prompt tokens it reused."""
    t0 = time.perf_counter()
    dt, last = None, None
    async for event in engine.submit(req):
        if dt is None and event.token_ids:
            dt = time.perf_counter() - t0
        last = event
    return dt, last.usage.cached_tokens


def mlxcel_ttft(path: str, first: list[int], second: list[int]) -> tuple[float, int]:
    import asyncio

    from mlxcel.testing.engine import engine_for, request, run

    engine = engine_for(path, parallel=4, cache=True)
    try:
        run(engine, [request(first, 4)])
        return asyncio.run(first_token(engine, request(second, 4)))
    finally:
        engine.shutdown()


def mlx_lm_ttft(model, first: list[int], second: list[int]) -> tuple[float, int]:
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    cache = make_prompt_cache(model)
    for _ in zip(range(4), generate_step(mx.array(first), model, prompt_cache=cache),
                 strict=False):
        pass
    trim_prompt_cache(cache, cache[0].offset - len(first))  # back to turn 1's prompt
    t0 = time.perf_counter()
    token, _ = next(generate_step(mx.array(second[len(first):]), model, prompt_cache=cache))
    int(token)
    return time.perf_counter() - t0, len(first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="30m")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--tail", type=int, default=190)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mlx-lm-dtype", default="float32",
                    help="mlx-lm's compute dtype: mlxcel's on the CPU is float32 (--dtype auto); "
                         "'keep' leaves the checkpoint's")
    args = ap.parse_args()
    from mlx_lm import load
    from mlxcel.testing.bench_checkpoints import named_checkpoint

    path = str(named_checkpoint(args.shape))
    model, tok = load(path)
    if args.mlx_lm_dtype != "keep":  # both engines on the same dtype, or it is what is timed
        model.set_dtype(getattr(mx, args.mlx_lm_dtype))
    ours, theirs = [], []
    for r in range(args.repeats):
        first, second = prompts(tok.vocab_size, args.tokens, args.tail, seed=r)
        dt, cached = mlxcel_ttft(path, first, second)
        ours.append(dt)
        dt2, _ = mlx_lm_ttft(model, first, second)
        theirs.append(dt2)
        print(f"repeat {r}: mlxcel {dt * 1000:.0f} ms (cached {cached}), "
              f"mlx-lm {dt2 * 1000:.0f} ms", flush=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"median: mlxcel {a * 1000:.0f} ms, mlx-lm {b * 1000:.0f} ms, ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
