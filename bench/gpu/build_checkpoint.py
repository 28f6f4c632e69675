"""Build the random-weight benchmark checkpoint for bench/gpu/run.sh; prints its path last.

    python bench/gpu/build_checkpoint.py --preset llama3-8b --cache-dir /tmp/bench-ckpts
    python bench/gpu/build_checkpoint.py --preset tiny      # same script, tiny shape (CPU test)

Uses ``mlxcel.testing.bench_checkpoints.bench_checkpoint`` (mlxcel's offline builder, EOS and every
special / partial-UTF-8 / whitespace-only token suppressed). ``llama3-8b`` is Llama-3-8B-shaped:
hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab 128256, bf16. The
builder's BPE tokenizer learns what the bundled corpus allows and pads the vocabulary with
``<|reserved_N|>`` special tokens up to 128256, so every id decodes; the suppressed rows are
never picked by greedy decoding, but the embedding and lm_head keep all 128256 rows (the
lm_head matmul costs what Llama-3-8B's does).
"""

from __future__ import annotations

import argparse
import sys
import time

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
    # Llama-3-8B's layer structure (32 layers, 32/8 heads: the same ops per step) at tiny
    # width: a CPU proxy for the host-side cost of a decode step
    "skeleton": {
        "shape": "llama",
        "hidden_size": 256,
        "num_layers": 32,
        "num_heads": 32,
        "num_kv_heads": 8,
        "intermediate_size": 512,
        "vocab_size": 4096,
        "dtype": "float32",
    },
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
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    from mlxcel.testing.bench_checkpoints import bench_checkpoint, checkpoint_info

    kw = dict(PRESETS[args.preset])
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
