"""How long does a request's first token take on the engine thread, for an image prompt
and for the next question about the same image (a prompt-cache hit: a short tail)?

In process, no HTTP: an ``EngineWorker`` on the tiny Qwen2.5-VL that ``bench/vision.py``
builds (its processor keeps the real pixel bounds: 256 image tokens), driven on this thread; a request's time to first token is from its submit to its first
token event. For each of ``--images`` images (448x448, distinct): the image and a
question (cold: the vision tower and the whole prompt), then the same prompt with a few
more tokens (warm: the image's features, its prompt-cache entry, the tail). Prints JSON:
the medians and their ratio, and how many engine steps each first token took.

    python bench/probes/first_token.py --images 10
    python bench/probes/first_token.py --burst 8 --burst-chunks 8   # 8 images at once
    python3 bench/probes/first_token.py --shape qwen2.5-vl-7b --dtype bfloat16 --burst 8  # GPU

``--burst N``: N requests with distinct images submitted at once instead (the c = 8 case),
each request's time to its first token; ``--burst-chunks`` sets the policy's burst budget
(CUDA's is 8 chunks, the CPU's 1): 8 lets image rows prefill in groups as on a GPU, 1
makes each 300-token image row prefill alone (the A/B on one machine).
    PYTHONPATH=/tmp/old/core/src:/tmp/old/families/vlm/src python bench/probes/first_token.py
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import pathlib
import statistics
import tempfile
import time


def image(seed: int):
    import numpy as np
    from mlxcel.media.api import MediaLimits
    from mlxcel.media.image import decode
    from mlxcel.types.media import MediaBlob
    from PIL import Image

    out = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((448, 448, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(out, "PNG")
    return decode(MediaBlob.of(out.getvalue(), "image/png", "data"), MediaLimits())


def first_token(worker, req) -> tuple[float, int, list[int]]:
    """(seconds to the first token, engine steps, every token) of ``req``."""
    from mlxcel.testing.engine import ListSink, run_until_done

    sink = ListSink()
    start = time.perf_counter()
    worker.enqueue(req, sink)
    steps = 0
    while not sink.tokens and not sink.done:
        worker.step()
        steps += 1
    seconds = time.perf_counter() - start
    run_until_done(worker, [sink], settle=True)
    return seconds, steps, sink.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--shape", default="qwen2.5-vl-tiny", help="bench/vision.py's SHAPES")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--dtype", default="float32", help="bfloat16 for a GPU's 7B shapes")
    ap.add_argument("--burst", type=int, default=0)
    ap.add_argument("--burst-chunks", type=int, default=None,
                    help="the policy's burst budget in chunks (default: this device's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tower-together", choices=("auto", "on", "off"), default="auto",
                    help="a group's images through one tower call (EnginePolicy."
                         "media_together; auto: this device's)")
    ap.add_argument("--checkpoint-dir", default=f"{tempfile.gettempdir()}/mlxcel-probe-ckpts")
    args = ap.parse_args()

    from mlxcel.families.api import LoadOptions
    from mlxcel.testing.engine import media_request, worker_for
    from mlxcel_family_vlm.load import decoder, load

    spec = importlib.util.spec_from_file_location(
        "vision_bench", pathlib.Path(__file__).resolve().parents[1] / "vision.py")
    vision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vision)
    path = vision.build(args.shape, pathlib.Path(args.checkpoint_dir), args.dtype)
    model = decoder(load(path, LoadOptions()))
    tokenizer = model.processor.tokenizer
    ids = list(tokenizer.encode("<|image_pad|> What is in the picture?",
                                add_special_tokens=False))
    more = list(tokenizer.encode(" And what colour is it, mostly?", add_special_tokens=False))
    if args.burst:
        return burst(args, path, model, ids)
    worker = worker_for(path, cache=True, chunk=512, parallel=4)
    # one untimed pair: the first use of each shape
    cold, warm = [], []
    steps = {"cold": [], "warm": []}
    for seed in range(args.images + 1):
        item = image(seed)
        first = model.expand_media(ids, [item], {})
        then = model.expand_media(ids + more, [item], {})
        a = first_token(worker, media_request(first, args.max_tokens))
        b = first_token(worker, media_request(then, args.max_tokens))
        if seed:
            cold.append(a[0])
            warm.append(b[0])
            steps["cold"].append(a[1])
            steps["warm"].append(b[1])
    out = {
        "shape": args.shape, "images": args.images,
        "prompt_tokens": len(first.token_ids), "tail_tokens": len(then.token_ids)
        - len(first.token_ids),
        "cold_ms_p50": round(statistics.median(cold) * 1e3, 2),
        "warm_ms_p50": round(statistics.median(warm) * 1e3, 2),
        "warm_over_cold": round(statistics.median(warm) / statistics.median(cold), 3),
        "steps_to_first_token": {k: statistics.median(v) for k, v in steps.items()},
    }
    print(json.dumps(out, indent=1))


def burst(args, path, model, ids) -> None:
    """``--burst``: rounds of N distinct image requests submitted together; per round each
    request's seconds to its first token (median, slowest) and the engine steps taken."""
    from mlxcel.testing.engine import ListSink, media_request, run_until_done, worker_for

    policy = {"burst_chunks": args.burst_chunks} if args.burst_chunks else {}
    if args.tower_together != "auto":
        policy["media_together"] = args.tower_together == "on"
    worker = worker_for(path, cache=False, chunk=512, parallel=args.burst, **policy)
    rounds = []
    for r in range(args.rounds + 1):  # the first round untimed: each shape's first use
        reqs = [media_request(model.expand_media(ids, [image(1000 * r + i)], {}),
                              args.max_tokens) for i in range(args.burst)]
        sinks = [ListSink() for _ in reqs]
        start = time.perf_counter()
        for req, sink in zip(reqs, sinks, strict=True):
            worker.enqueue(req, sink)
        firsts: dict[int, float] = {}
        steps = 0
        while len(firsts) < len(sinks):
            worker.step()
            steps += 1
            now = time.perf_counter()
            for i, sink in enumerate(sinks):
                if i not in firsts and (sink.tokens or sink.done):
                    firsts[i] = now - start
        run_until_done(worker, sinks, settle=True)
        if r:
            ttft = sorted(firsts.values())
            rounds.append({"ttft_ms_p50": round(statistics.median(ttft) * 1e3, 1),
                           "ttft_ms_max": round(ttft[-1] * 1e3, 1), "steps": steps})
    print(json.dumps({"shape": args.shape, "burst": args.burst,
                      "burst_chunks": args.burst_chunks,
                      "tower_together": args.tower_together, "rounds": rounds,
                      "ttft_ms_p50": statistics.median(x["ttft_ms_p50"] for x in rounds),
                      "ttft_ms_max": statistics.median(x["ttft_ms_max"] for x in rounds)},
                     indent=1))


if __name__ == "__main__":
    main()
