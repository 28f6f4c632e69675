"""Where a serving step's time goes: raw decode loop vs mlxcel's engine alone (no HTTP).

Runs mlxcel's ``EngineClient`` in-process (same loader, same --dtype resolution, same
engine thread) with a closed-loop load of C streams and N requests, consuming the events
on an asyncio loop without any HTTP, and reports tok/s and engine steps/s; with
``--profile`` the engine thread runs under cProfile and the top functions by own time are
printed. Compare with ``bench/gpu/raw_loop.py`` (model only) and ``bench/serving.py`` (full
server) on the same checkpoint to split the gap into engine and HTTP/streaming costs.

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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


async def drive(client, tokenizer, template_render, c: int, n: int, max_tokens: int) -> dict:
    from mlxcel.types import GenerationRequest
    from mlxcel.types.requests import SamplingParams
    from serving import prompt_for

    prompts = [tokenizer.encode(template_render(prompt_for("prof", i))) for i in range(n)]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="--dtype for the loader (default: auto)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    from mlxcel.engine.client import EngineClient
    from mlxcel.engine.loader import load_checkpoint
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.plugins import load_plugins
    from serving import CHECKPOINTS, bench_checkpoint

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
    client = EngineClient(
        lambda: load_checkpoint(str(path), families, dtype=args.dtype),
        args.concurrency,
        prefill_chunk=512,
        max_queue_depth=10_000,
    )
    client.start()
    client.worker.ready.wait()
    ck = client.checkpoint
    print(f"{path.name}: device {ck.device}, dtype {ck.dtype}, blas {ck.blas}")

    def render(text: str) -> str:
        return ck.template.render([{"role": "user", "content": text}], add_generation_prompt=True)

    async def both() -> tuple[dict, dict]:
        await drive(client, ck.tokenizer, render, args.concurrency, args.concurrency, 4)
        s0 = client.worker.stats.decode_steps_processed
        r = await drive(
            client, ck.tokenizer, render, args.concurrency, args.requests, args.max_tokens
        )
        r["decode_steps"] = client.worker.stats.decode_steps_processed - s0
        return r

    try:
        r = asyncio.run(both())
    finally:
        client.shutdown()
    steps = r["decode_steps"]
    print(
        f"engine only, C={args.concurrency} N={args.requests} max_tokens={args.max_tokens}: "
        f"{r['tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, {steps} decode steps, "
        f"{r['wall_s'] / steps * 1e3:.2f} ms per engine iteration, "
        f"mean batch {r['tokens'] / steps:.2f}"
    )
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
