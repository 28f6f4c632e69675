"""Where a serving step's time goes: raw decode loop vs mlxcel's engine alone (no HTTP).

Runs mlxcel's ``EngineClient`` in-process (same loader, same --dtype resolution, same
engine thread) with a closed-loop load of C streams and N requests, consuming the events
on an asyncio loop without any HTTP, and reports tok/s and engine steps/s; with
``--profile`` the engine thread runs under cProfile and the top functions by own time are
printed; with ``--timing`` the engine's phases (prefill chunk, join, decode launch, read-back,
row drop, prompt-cache store) are wall-clocked and summarised; ``--repeat R`` runs the load
R times in one process (the first run pays one-time costs such as kernel compilation).

Rule: compare it with ``bench/gpu/raw_loop.py`` (model only) and ``bench/serving.py`` (full
server) on the same checkpoint and prompts (``bench_prompt``), so a gap splits into engine
and HTTP/streaming costs.

    blas=$(python -m mlxcel.backend); LD_PRELOAD=$blas python bench/engine_profile.py \
        --checkpoint tiny --concurrency 16 --requests 32 --max-tokens 64 [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pathlib
import pstats
import sys
import time
import uuid

from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint
from mlxcel.testing.servers import bench_prompt


async def drive(client, tokenizer, template_render, c: int, n: int, max_tokens: int) -> dict:
    from mlxcel.types import GenerationRequest
    from mlxcel.types.requests import SamplingParams

    prompts = [tokenizer.encode(template_render(bench_prompt("prof", i))) for i in range(n)]
    pending = list(range(n))
    ttfts: list[float] = []
    tokens = 0

    async def stream() -> None:
        nonlocal tokens
        while pending:
            i = pending.pop()
            req = GenerationRequest(
                request_id=uuid.uuid4().hex,
                prompt_tokens=tuple(prompts[i]),
                max_tokens=max_tokens,
                ignore_eos=True,
                sampling=SamplingParams(temperature=0.0),
            )
            t0 = time.perf_counter()
            first = None
            async for ev in client.submit(req):
                if first is None and ev.text:
                    first = time.perf_counter() - t0
                if ev.usage is not None:
                    tokens += ev.usage.completion_tokens
            ttfts.append(first or 0.0)

    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(c)))
    wall = time.perf_counter() - t0
    ttfts.sort()
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1e3,
    }


def install_timers() -> dict[str, list[float]]:
    """Wall-clock the engine's phases (wrapping the methods in place)."""
    from mlxcel.engine import batch, worker

    timings: dict[str, list[float]] = {}
    targets = [(batch.PrefillJob, "step", "prefill chunk"), (batch.DecodeBatch, "join", "join"),
               (batch.DecodeBatch, "launch", "decode launch"),
               (batch.DecodeBatch, "drop_finished", "drop rows"),
               (worker.EngineWorker, "_read_back", "read back"),
               (worker.EngineWorker, "_remember", "prompt-cache store")]
    for cls, name, label in targets:
        def wrap(fn, label=label):
            def timed(*a, **kw):
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    timings.setdefault(label, []).append(time.perf_counter() - t)
            return timed
        setattr(cls, name, wrap(getattr(cls, name)))
    return timings


def timing_table(timings: dict[str, list[float]], wall: float) -> str:
    rows = [f"  {'phase':20s} {'calls':>6s} {'total s':>8s} {'share':>6s} {'p50 ms':>8s} "
            f"{'max ms':>8s}"]
    for label, xs in timings.items():
        xs = sorted(xs)
        rows.append(f"  {label:20s} {len(xs):6d} {sum(xs):8.3f} {sum(xs) / wall:6.1%} "
                    f"{xs[len(xs) // 2] * 1e3:8.2f} {xs[-1] * 1e3:8.2f}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="--dtype for the loader (default: auto)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-cache-prompt", action="store_true",
                    help="turn the prompt cache off (the server's default has it on)")
    args = ap.parse_args()

    from mlxcel.app import prompt_cache_from
    from mlxcel.engine.client import EngineClient
    from mlxcel.engine.loader import load_checkpoint
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.plugins import load_plugins
    from mlxcel.settings import Settings

    if args.model:
        path = pathlib.Path(args.model)
    else:
        kw = dict(CHECKPOINTS[args.checkpoint])
        path = bench_checkpoint(kw.pop("shape"), **kw)
    families = load_plugins().families
    prof = cProfile.Profile() if args.profile else None
    if prof is not None:  # run the engine thread's loop under the profiler
        run = EngineWorker.run

        def profiled(self) -> None:
            prof.runcall(run, self)

        EngineWorker.run = profiled
    timings = install_timers() if args.timing else None
    client = EngineClient(
        lambda: load_checkpoint(str(path), families, dtype=args.dtype),
        args.concurrency,
        prefill_chunk=512,
        max_queue_depth=10_000,
        prompt_cache=prompt_cache_from(Settings(no_cache_prompt=args.no_cache_prompt)),
    )
    client.start()
    client.worker.ready.wait()
    ck = client.checkpoint
    print(f"{path.name}: device {ck.device}, dtype {ck.dtype}, blas {ck.blas}")

    def render(text: str) -> str:
        return ck.template.render([{"role": "user", "content": text}], add_generation_prompt=True)

    async def one() -> dict:
        s0 = client.worker.stats.decode_steps_processed
        r = await drive(
            client, ck.tokenizer, render, args.concurrency, args.requests, args.max_tokens
        )
        r["decode_steps"] = client.worker.stats.decode_steps_processed - s0
        return r

    try:
        asyncio.run(drive(client, ck.tokenizer, render, args.concurrency, args.concurrency, 4))
        for run in range(args.repeat):
            if timings is not None:
                timings.clear()
            r = asyncio.run(one())
            steps = r["decode_steps"]
            print(
                f"[run {run + 1}] engine only, C={args.concurrency} N={args.requests} "
                f"max_tokens={args.max_tokens}: {r['tok_s']:.1f} tok/s, TTFT p50 "
                f"{r['ttft_p50_ms']:.0f} ms, {steps} decode steps, "
                f"{r['wall_s'] / steps * 1e3:.2f} ms per engine iteration, "
                f"mean batch {r['tokens'] / steps:.2f}", flush=True
            )
            if timings is not None:
                print(timing_table(timings, r["wall_s"]), flush=True)
    finally:
        client.shutdown()
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
