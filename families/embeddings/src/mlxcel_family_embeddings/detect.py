"""Which checkpoints this family owns, and for which task: read from the checkpoint's files
only (``config.json``, sentence-transformers ``modules.json`` and its module folders), with
no MLX import and no weight read, since it runs in the CLI before the server forks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENCODERS = ("bert", "modernbert", "xlm-roberta", "xlm_roberta")
DECODERS = ("qwen3", "gemma3_text")
# sentence-transformers' pooling flags -> the task contract's pooling names
POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_lasttoken": "last"}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def modules(path: Path) -> list[dict[str, Any]]:
    """The sentence-transformers modules, in order ([] when the checkpoint has none)."""
    listed = _json(Path(path) / "modules.json")
    return [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []


def pooling_of(path: Path, default: str) -> str:
    """The checkpoint's pooling from its ``Pooling`` module's config (mean, cls or last);
    ``default`` when it has none."""
    for module in modules(path):
        if str(module.get("type", "")).endswith("Pooling"):
            cfg = _json(Path(path) / str(module.get("path", "")) / "config.json") or {}
            if isinstance(cfg.get("pooling_mode"), str):
                mode = cfg["pooling_mode"]
                return {"lasttoken": "last", "cls": "cls"}.get(mode, "mean")
            for flag, name in POOLING_FLAGS.items():
                if cfg.get(flag):
                    return name
            return "mean"
    return default


def dense_dirs(path: Path) -> list[Path]:
    """The folders of the ``Dense`` modules applied after pooling, in order."""
    return [Path(path) / str(m.get("path", "")) for m in modules(path)
            if str(m.get("type", "")).endswith("Dense")]


def _architectures(config: dict) -> list[str]:
    return [str(a) for a in config.get("architectures") or []]


def is_cross_encoder(config: dict) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in _architectures(config))


def is_generative_reranker(path: Path, config: dict) -> bool:
    """A Qwen3 causal LM trained to answer yes/no (Qwen3-Reranker): its name says so, as
    nothing in its config does."""
    names = (Path(path).resolve().name, str(config.get("_name_or_path", "")))
    return config.get("model_type") == "qwen3" and \
        any("reranker" in name.lower() for name in names)


def _pooled(path: Path) -> bool:
    return any(str(m.get("type", "")).endswith("Pooling") for m in modules(path))


def check(path: Path, config: dict) -> bool | str:
    """An encoder embedder or cross-encoder, a decoder embedder (sentence-transformers
    pooling, or encoder-only architectures), or a Qwen3 generative reranker."""
    model_type = config.get("model_type")
    if model_type in ENCODERS:
        if is_cross_encoder(config) and int(config.get("num_labels") or
                                            len(config.get("id2label") or {}) or 1) != 1:
            return "a sequence classifier with more than one label is not a reranker"
        return True
    if model_type in DECODERS:
        archs = _architectures(config)
        if _pooled(path) or (archs and all(a.endswith("Model") for a in archs)):
            return True
        if is_generative_reranker(path, config):
            return True
        return f"a {model_type} chat model (no sentence-transformers pooling)"
    return f"model_type '{model_type}' is not an embedder or reranker this family knows"


def tasks_of(path: Path, config: dict) -> tuple[str, ...]:
    """``rerank`` for cross-encoders and generative rerankers, else ``embed``."""
    if is_cross_encoder(config) or is_generative_reranker(path, config):
        return ("rerank",)
    return ("embed",)
