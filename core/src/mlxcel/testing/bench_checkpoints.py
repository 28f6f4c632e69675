"""The benchmarks' checkpoints: named shapes built offline by ``cached_checkpoint``, with
the logits of EOS and of every token the servers would stream differently zeroed, and the
facts a result records about a checkpoint. Importing this module imports no mlx, numpy or
tokenizers; each is imported where it is used.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import struct
from typing import Any

# Named bench checkpoints (cached_checkpoint arguments; bench_checkpoint adds suppress_eos).
# "30m" has the untied lm_head that suppressing tokens needs. The gemma4 ones keep the
# builder's gemma4_text recipe (num_layers = the layers with their own KV; as many again
# reuse it; sliding and full attention in turn): "gemma4-tiny" with its 16-token window
# (every bench prompt overflows it in prefill), "gemma4-30m" (33.1M parameters) with a
# 128-token window, longer than the bench prompt (78-80 tokens with the template) and
# shorter than prompt + 64 tokens, so each row's rotating cache wraps during decode (rows
# a step or two apart). "llama-deep" is Llama-3-8B's layer structure (32 layers, 32 query
# and 8 KV heads, the same ops per decode step) at tiny width, so a step's compute is
# negligible and what a CPU run measures is the host's work of building that step.
# "gemma4-deep" is the same for Gemma-4-E4B's layer structure: 42 layers, the last 18
# reusing earlier layers' KV, five sliding-window (512) layers to one full one.
# The prompt-cache scenario bench (bench/prompt_cache.py) adds: "gemma4-30m-512", the
# gemma4-30m recipe with a 512-token window (Gemma-4-E4B's); "qwen3-next-30m" (35M
# parameters: hidden 512, 8 layers, three gated delta-net layers to one full-attention
# layer as Qwen3-Next has them, 4 experts of which 2 per token plus the shared expert) and
# "qwen3-next-tiny" (the builder's qwen3_next recipe: one delta-net layer, one full), both
# float32 (mlx_lm.server's MoE on a CPU runs GatherMM, which takes float32 only). On
# the H200 (bench/gpu/prompt_cache.sh): "gemma4-e4b", google/gemma-4-E4B's text model in
# shape (bench/gpu/build_checkpoint.py's preset of that name, 8.1B parameters), and
# "qwen3-next-gpu", Qwen3-Next-80B-A3B's layers at their real widths (hidden 2048, 48
# layers, 16/2 heads of 256, delta-net 32 value / 16 key heads of 128, 10 experts per
# token of 512 wide, a shared expert, vocab 151936) with 64 experts instead of 512:
# 12.0B parameters, 24 GB in bf16, the real model's active parameters per token.
# Every one of them renders the builder's default chatml template.
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "tiny": {"shape": "qwen3"},
    "30m": {
        "shape": "qwen3",
        "hidden_size": 512,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 4,
        "intermediate_size": 1536,
        "vocab_size": 8192,
    },
    "llama-deep": {
        "shape": "llama",
        "hidden_size": 256,
        "num_layers": 32,
        "num_heads": 32,
        "num_kv_heads": 8,
        "intermediate_size": 512,
        "vocab_size": 4096,
    },
    "gemma4-tiny": {"shape": "gemma4_text"},
    "gemma4-deep": {
        "shape": "gemma4_text",
        "hidden_size": 256,
        "num_layers": 21,
        "num_heads": 8,
        "num_kv_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 4096,
        "config": {"sliding_window": 512, "num_kv_shared_layers": 18,
                   "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7},
    },
    "gemma4-30m": {
        "shape": "gemma4_text",
        "hidden_size": 512,
        "num_layers": 4,
        "num_heads": 8,
        "num_kv_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 8192,
        "config": {"sliding_window": 128},
    },
    "qwen3-next-30m": {
        "shape": "qwen3_next",
        "hidden_size": 512,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 8192,
        "dtype": "float32",
        "config": {"full_attention_interval": 4},
    },
    "qwen3-next-tiny": {"shape": "qwen3_next", "dtype": "float32"},
    "gemma4-e4b": {
        "shape": "gemma4_text",
        "hidden_size": 2560,
        "num_layers": 21,
        "num_heads": 8,
        "num_kv_heads": 2,
        "intermediate_size": 10240,
        "vocab_size": 262144,
        "config": {"num_hidden_layers": 42, "num_kv_shared_layers": 18,
                   "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7,
                   "sliding_window": 512, "head_dim": 256, "global_head_dim": 512,
                   "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
                   "use_double_wide_mlp": False, "max_position_embeddings": 131072},
    },
    "qwen3-next-gpu": {
        "shape": "qwen3_next",
        "hidden_size": 2048,
        "num_layers": 48,
        "num_heads": 16,
        "num_kv_heads": 2,
        "intermediate_size": 5120,
        "vocab_size": 151936,
        "config": {"head_dim": 256, "full_attention_interval": 4, "num_experts": 64,
                   "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512, "linear_num_value_heads": 32,
                   "linear_num_key_heads": 16, "linear_key_head_dim": 128,
                   "linear_value_head_dim": 128, "rope_theta": 10000000.0,
                   "max_position_embeddings": 262144},
    },
}
CHECKPOINTS["gemma4-30m-512"] = {**CHECKPOINTS["gemma4-30m"],
                                 "config": {"sliding_window": 512}}

# Targets per kind: (level, metric, op, bound). level "lo" / "hi": the lowest / highest
# concurrency compared; metric "ratio:KEY" (mlxcel / mlx_lm of a level statistic), "raw"
# (mlxcel aggregate / raw loop at the same batch), "failed" (mlxcel requests failed, all
# levels) or "failed_not_503". "cpu" and "gpu" resolve to "<kind>-gemma4" for a
# gemma4_text checkpoint; "gpu-arrival" is the Llama-3-8B continuous-arrival load.
TARGETS: dict[str, list[tuple[str, str, str, float]]] = {
    "none": [],
    "cpu": [
        ("lo", "ratio:agg_tok_s", ">=", 1.0),
        ("hi", "ratio:agg_tok_s", ">=", 1.5),
        ("hi", "ratio:ttft_p50_ms", "<=", 0.5),
    ],
    "gpu": [("lo", "raw", ">=", 0.9), ("hi", "raw", ">=", 0.85), ("", "failed_not_503", "<=", 0)],
    "gpu-arrival": [("lo", "raw", ">=", 0.95), ("hi", "raw", ">=", 0.85), ("", "failed", "<=", 0)],
    "gpu-gemma4": [("lo", "raw", ">=", 0.95), ("hi", "raw", ">=", 0.8), ("", "failed", "<=", 0)],
}
TARGETS["cpu-gemma4"] = [*TARGETS["cpu"], ("", "failed", "<=", 0)]
_LABELS = {
    "ratio:agg_tok_s": "aggregate tok/s mlxcel/mlx_lm",
    "ratio:ttft_p50_ms": "TTFT p50 mlxcel/mlx_lm",
    "raw": "mlxcel aggregate / raw loop",
    "failed": "mlxcel requests failed",
    "failed_not_503": "mlxcel requests failed (not 503)",
}


def check_targets(entry: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The targets of ``kind`` (:data:`TARGETS`) for one serving.py entry, each with its
    value and whether it is met. Ratio targets need both servers (and, for "cpu", the
    ``defaults`` mode); a one-level run has only its "lo" targets; "raw" ones need the raw
    loop's results in the entry."""
    if kind in ("cpu", "gpu") and entry["checkpoint"].get("model_type") == "gemma4_text":
        kind += "-gemma4"
    specs = TARGETS[kind]
    raw = any(m == "raw" for _, m, _, _ in specs)
    table = entry.get("vs_raw") if raw else entry["ratios"]
    if not table or (kind.startswith("cpu") and entry["mode"] != "defaults"):
        return []
    cs = sorted(int(c) for c in table)
    at = {"lo": str(cs[0]), "hi": str(cs[-1])}
    levels = entry["servers"].get("mlxcel", {}).get("levels", {}).values()
    out: list[dict[str, Any]] = []
    for level, metric, op, bound in specs:
        if level == "hi" and at["hi"] == at["lo"]:
            continue  # a concurrency-1 run (decode speed) has only the first targets
        c = at.get(level)
        if metric.startswith("failed"):
            what = _LABELS[metric]
            value: float | None = sum(
                n
                for st in levels
                for k, n in st["failures"].items()
                if metric == "failed" or k != "http_503"
            )
        elif metric == "raw":
            what, value = f"c={c} {_LABELS[metric]}", table[c].get("mlxcel")
        else:
            what, value = f"c={c} {_LABELS[metric]}", table[c][metric.partition(":")[2]]
        met = value is not None and (value >= bound if op == ">=" else value <= bound)
        out.append({"target": what, "value": value, "bound": f"{op} {bound}", "met": met})
    return out


def safetensors_params(path: pathlib.Path) -> int:
    """Parameter count from the safetensors headers (no tensor is loaded)."""
    total = 0
    for f in sorted(pathlib.Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(math.prod(m["shape"]) for k, m in header.items() if k != "__metadata__")
    return total


def checkpoint_info(path: pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(path)
    cfg = json.loads((path / "config.json").read_text())
    keys = (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "torch_dtype",
        "tie_word_embeddings",
    )
    bad = unclean_ids(path / "tokenizer.json")
    return {
        "path": str(path),
        **{k: cfg.get(k) for k in keys},
        "params": safetensors_params(path),
        "sampleable_tokens": cfg["vocab_size"] - len(bad),
    }


def unclean_ids(tokenizer_json: pathlib.Path) -> list[int]:
    """Ids whose text alone is not plain, complete text: every added (special or control)
    token (mlxcel skips special tokens, mlx_lm prints them), every byte that is not a whole
    UTF-8 character (both servers hold those back) and whitespace-only tokens (mlx_lm holds
    a lone space for one token)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    added = tok.get_added_tokens_decoder()
    bad = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        if i in added or "\ufffd" in text or not text.strip():
            bad.append(i)
    return bad


def bench_checkpoint(
    shape: str, cache_dir: str | os.PathLike | None = None, **kw: Any
) -> pathlib.Path:
    """``cached_checkpoint(shape, suppress_eos=True, **kw)`` with the lm_head rows of every
    :func:`unclean_ids` token zeroed as well as EOS's, so greedy decoding on random weights
    only picks ordinary tokens and every token is one content chunk on both servers (TTFT
    and inter-token latency stay comparable). Cached apart
    (``$MLXCEL_CACHE_DIR/bench-checkpoints``): it differs from the builder's only there."""
    import mlxcel.testing.checkpoint as ckpt

    root = (
        pathlib.Path(cache_dir)
        if cache_dir is not None
        else ckpt.default_cache_dir().parent / "bench-checkpoints"
    )
    where: dict[str, pathlib.Path] = {}
    write_tokenizer, suppress = ckpt._write_tokenizer, ckpt._suppress_eos

    def _write_tokenizer(path: pathlib.Path, *a: Any, **k: Any) -> Any:
        where["path"] = pathlib.Path(path)
        return write_tokenizer(path, *a, **k)

    def _suppress_eos(model: Any, eos_ids: list[int]) -> None:
        bad = unclean_ids(where["path"] / "tokenizer.json")
        suppress(model, sorted(set(eos_ids) | set(bad)))

    ckpt._write_tokenizer, ckpt._suppress_eos = _write_tokenizer, _suppress_eos
    try:
        return ckpt.cached_checkpoint(shape, cache_dir=root, suppress_eos=True, **kw)
    finally:
        ckpt._write_tokenizer, ckpt._suppress_eos = write_tokenizer, suppress


def named_checkpoint(name: str) -> pathlib.Path:
    """The bench checkpoint of a :data:`CHECKPOINTS` name."""
    kw = dict(CHECKPOINTS[name])
    return bench_checkpoint(kw.pop("shape"), **kw)
