"""Build the random-weight benchmark checkpoint for bench/gpu/run.sh; prints its path last.

    python bench/gpu/build_checkpoint.py --preset llama3-8b --cache-dir /tmp/bench-ckpts
    python bench/gpu/build_checkpoint.py --preset gemma4-e4b --cache-dir /tmp/bench-ckpts
    python bench/gpu/build_checkpoint.py --preset tiny      # same script, tiny shape (CPU test)
    python bench/gpu/build_checkpoint.py --preset gemma4-e4b --dry-run   # shapes only, no weights

Uses ``mlxcel.testing.bench_checkpoints.bench_checkpoint`` (mlxcel's offline builder, EOS and every
special / partial-UTF-8 / whitespace-only token suppressed). ``llama3-8b`` is Llama-3-8B-shaped:
hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab 128256, bf16. The
builder's BPE tokenizer learns what the bundled corpus allows and pads the vocabulary with
``<|reserved_N|>`` special tokens up to 128256, so every id decodes; the suppressed rows are
never picked by greedy decoding, but the embedding and lm_head keep all 128256 rows (the
lm_head matmul costs what Llama-3-8B's does).

``gemma4-e4b`` is google/gemma-4-E4B's text model in shape (``gemma4_text``, bf16): hidden
2560, 42 layers of which the last 18 reuse the KV of earlier ones (24 KV caches), five
sliding-window (512) layers then one full-attention layer, 8 heads, 2 KV heads, head_dim
256 (512 on full-attention layers), intermediate 10240, vocab 262144, per-layer inputs of
256, final logit soft-cap 30; ``use_double_wide_mlp`` false as in E4B's published config
(E2B's is true). Its lm_head is untied (token suppression needs one): 8.1B parameters,
about 16 GB, of which 2.8B are the per-layer embedding table (read by row, not per step).
``gemma4-tiny`` is that layer structure at tiny width (a CPU dry run of run.sh).
"""

from __future__ import annotations

import argparse
import sys
import time

from mlxcel.testing.bench_checkpoints import CHECKPOINTS

GEMMA4_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]


def gemma4(
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    vocab: int,
    layers: int,
    shared: int,
    window: int,
    per_layer: int,
    dtype: str,
) -> dict:
    """A gemma4_text preset: the builder's recipe with Gemma 4 E-model fields over it."""
    return {
        "shape": "gemma4_text",
        "hidden_size": hidden,
        "num_layers": layers // 2,  # the recipe doubles it; the overrides below set it
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "dtype": dtype,
        "config": {
            "num_hidden_layers": layers,
            "num_kv_shared_layers": shared,
            "layer_types": (GEMMA4_PATTERN * layers)[:layers],
            "sliding_window": window,
            "head_dim": head_dim,
            "global_head_dim": 2 * head_dim,
            "hidden_size_per_layer_input": per_layer,
            "vocab_size_per_layer_input": vocab,
            "use_double_wide_mlp": False,
            "max_position_embeddings": 131072,
        },
    }


PRESETS = {
    "llama3-8b": {
        "shape": "llama",
        "hidden_size": 4096,
        "num_layers": 32,
        "num_heads": 32,
        "num_kv_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "dtype": "bfloat16",
    },
    # Llama-3.2-1B-shaped, the target's vocabulary: bench/speculative.py's draft model
    "llama3-1b": {
        "shape": "llama",
        "hidden_size": 2048,
        "num_layers": 16,
        "num_heads": 32,
        "num_kv_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "dtype": "bfloat16",
    },
    # a draft for the "30m" bench checkpoint (same shape family and vocabulary): CPU runs
    "tiny-draft": {
        "shape": "qwen3",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 8192,
    },
    "gemma4-e4b": gemma4(2560, 8, 2, 256, 10240, 262144, 42, 18, 512, 256, "bfloat16"),
    # Llama-3-8B's layer structure (32 layers, 32/8 heads: the same ops per step) at tiny
    # width: a CPU proxy for the host-side cost of a decode step
    "skeleton": {**CHECKPOINTS["llama-deep"], "dtype": "float32"},
    # same family and vocabulary handling, small enough for a 2-core CPU test of run.sh
    "tiny": {
        "shape": "llama",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1024,
        "dtype": "bfloat16",
    },
    # gemma4-e4b's structure (5 sliding + 1 full, the last ~3/7 KV-shared) at tiny width,
    # 12 layers (5 shared), a 32-token window: the raw loop's 48-token prompt overflows it
    "gemma4-tiny": gemma4(64, 4, 2, 16, 128, 1024, 12, 5, 32, 16, "bfloat16"),
}


def dry_run(kw: dict) -> dict:
    """Instantiate the preset's mlx-lm model without materialising its weights: the
    parameter count and the caches it decodes with."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes
    from mlxcel.testing import configs

    d = configs.Dims(
        kw["hidden_size"],
        kw["num_layers"],
        kw["num_heads"],
        kw["num_kv_heads"],
        kw["intermediate_size"],
        kw["vocab_size"],
    )
    cfg = {**configs.model_config(kw["shape"], d, kw["dtype"], 0, 1), **kw.get("config", {})}
    cfg["tie_word_embeddings"] = False  # as bench_checkpoint builds it
    model_class, args_class = _get_classes(cfg)
    model = model_class(args_class.from_dict(cfg))  # lazy: nothing is evaluated
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    caches = [type(c).__name__ for c in model.make_cache()] if hasattr(model, "make_cache") else []
    return {
        "params": params,
        "bytes": params * getattr(mx, kw["dtype"]).size,
        "layers": len(model.layers),
        "caches": {n: caches.count(n) for n in sorted(set(caches))},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--dry-run", action="store_true", help="instantiate lazily, build nothing")
    args = ap.parse_args()
    from mlxcel.testing.bench_checkpoints import bench_checkpoint, checkpoint_info

    kw = dict(PRESETS[args.preset])
    if args.dry_run:
        print(args.preset, dry_run(kw))
        return 0
    shape = kw.pop("shape")
    t = time.perf_counter()
    path = bench_checkpoint(shape, cache_dir=args.cache_dir, **kw)
    info = checkpoint_info(path)
    print(
        f"built {args.preset} in {time.perf_counter() - t:.1f}s: {info['params'] / 1e9:.3f}B "
        f"params, {info['sampleable_tokens']} of {info['vocab_size']} ids sampleable",
        file=sys.stderr,
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
