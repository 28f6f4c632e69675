"""Sampler cost per decode step at batch 16: every sampler on vs greedy.

Runs mlx-lm's model on a ~30M-parameter random qwen3 checkpoint (float32 on CPU, as the
server's --dtype auto picks there) with a [16, 1] decode input over a 256-token batched KV
cache, and times (a) forward + argmax and (b) forward + the full chain (repetition /
frequency / presence penalties, DRY, top-k, top-p, min-p, XTC, p-less, temperature, seeded
rows) as the engine runs it. Reports medians and the sampler share of the step.

    python bench/probes/sampler_cost.py [--steps 40] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlxcel.engine.penalties import Penalties
from mlxcel.engine.sampling import BatchSampler, RowRandom
from mlxcel.model.loader import load_checkpoint
from mlxcel.plugins import load_plugins
from mlxcel.testing.checkpoint import cached_checkpoint
from mlxcel.types import SamplingParams

ALL_ON = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, p_less=True,
                        repetition_penalty=1.1, repetition_context_size=64,
                        frequency_penalty=0.3, presence_penalty=0.3, dry_multiplier=0.8,
                        dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=0,
                        xtc_probability=0.5, xtc_threshold=0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seeded", action="store_true", help="every row has its own seed")
    ap.add_argument("--out", default="bench/results/sampler_cost.json")
    args = ap.parse_args()
    path = cached_checkpoint("qwen3", hidden_size=512, num_layers=8, vocab_size=8192,
                             num_heads=8, num_kv_heads=2, suppress_eos=True)
    ckpt = load_checkpoint(str(path), load_plugins().families)
    model = ckpt.model
    if mx.default_device() == mx.cpu:
        model.model.set_dtype(mx.float32)
    n_params = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(
        model.model.parameters()))
    B, V = args.batch, ckpt.tokenizer.vocab_size
    cache = [BatchKVCache([0] * B) for _ in model.make_cache()]
    prompt = mx.random.randint(0, V, (B, 256)).astype(mx.uint32)
    model(prompt, cache)
    mx.eval([c.keys for c in cache])
    params = [ALL_ON] * B  # seeds are an option, not a sampler: see --seeded
    if args.seeded:
        params = [SamplingParams(**{**_fields(ALL_ON), "seed": i}) for i in range(B)]
    sampler = BatchSampler(params, [RowRandom(p.seed) for p in params], V)
    penalties = Penalties(params)
    history = [list(range(i, i + 256)) for i in range(B)]
    inputs = mx.zeros((B,), dtype=mx.uint32)

    def step(full: bool) -> float:
        nonlocal inputs
        start = time.perf_counter()
        logits = model(inputs[:, None], cache)[:, -1, :]
        if full:
            tokens = sampler(penalties(logits, history, [h[-64:] for h in history]))
        else:
            tokens = mx.argmax(logits, axis=-1)
        mx.eval(tokens)
        inputs = tokens.astype(mx.uint32)
        for h, t in zip(history, tokens.tolist(), strict=True):
            h.append(t)
        for c in cache:
            c.trim(1)  # keep the context length constant between the two variants
        return time.perf_counter() - start

    for _ in range(5):
        step(False), step(True)
    greedy, full = [], []
    for _ in range(args.steps):
        greedy.append(step(False))
        full.append(step(True))
    g, f = statistics.median(greedy), statistics.median(full)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "params": n_params, "batch": B,
              "vocab": V, "context": 256, "dtype": str(model.model.layers[0].mlp.up_proj
                                                        .weight.dtype),
              "device": str(mx.default_device()), "machine": platform.platform(),
              "greedy_step_ms": round(g * 1e3, 2), "all_samplers_step_ms": round(f * 1e3, 2),
              "sampler_share_of_step": round((f - g) / f, 3)}
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    md = Path(args.out).with_suffix(".md")
    md.write_text(
        "# Sampler cost per decode step\n\n"
        f"{n_params / 1e6:.1f}M-parameter qwen3 checkpoint, batch {B}, vocab {V}, context 256, "
        f"{result['dtype']} on {result['device']}; medians of {args.steps} steps.\n\n"
        "| step | ms |\n|---|---:|\n"
        f"| forward + greedy argmax | {result['greedy_step_ms']} |\n"
        f"| forward + all samplers (penalties, DRY, top-k/p, min-p, XTC, p-less, seeds) | "
        f"{result['all_samplers_step_ms']} |\n\n"
        f"Sampler share of the step: **{result['sampler_share_of_step'] * 100:.1f}%** "
        "(target <= 15%).\n\nReproduce: `python bench/probes/sampler_cost.py`\n")


def _fields(p: SamplingParams) -> dict:
    return {k: getattr(p, k) for k in p.__struct_fields__}


if __name__ == "__main__":
    main()
