"""Load an embedder or reranker: the model through mlx-vlm's loaders (mlx-lm's for a
generative reranker, a plain causal LM), the tokenizer from ``tokenizer.json`` with the
``tokenizers`` library, and the sentence-transformers modules (pooling, Dense) from the
checkpoint's folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlxcel.families.api import Loaded, LoadOptions
from tokenizers import Tokenizer

from mlxcel_family_embeddings import detect

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": lambda x: x,
               "torch.nn.modules.activation.Tanh": mx.tanh}


@dataclass
class Dense:
    """A sentence-transformers Dense module: ``activation(x @ W.T + b)``."""

    weight: mx.array
    bias: mx.array | None
    activation: Any

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight.T
        return self.activation(y + self.bias if self.bias is not None else y)


@dataclass
class EmbeddingModel:
    """What the runners drive. ``kind``: ``encoder`` / ``decoder`` (embedders),
    ``cross`` (a sequence classifier) or ``generative`` (yes/no reranker)."""

    module: nn.Module
    kind: str
    pooling: str
    pad_id: int
    eos_id: int | None
    max_length: int
    dense: list[Dense] = field(default_factory=list)
    append_eos: bool = False
    token_types: bool = False


def _dense(folder: Path) -> Dense:
    cfg = detect._json(folder / "config.json") or {}
    weights: dict[str, mx.array] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(file)))
    name = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
    if name not in ACTIVATIONS:
        raise ValueError(f"{folder.name}: Dense activation {name!r} is not supported")
    weight = weights.get("linear.weight", weights.get("weight"))
    if weight is None:
        raise ValueError(f"{folder.name}: no Dense weight found")
    return Dense(weight, weights.get("linear.bias", weights.get("bias")), ACTIVATIONS[name])


def _module(path: Path, kind: str, config: dict) -> nn.Module:
    if kind == "generative":
        from mlx_lm.utils import load_model

        return load_model(path)[0]
    if kind == "cross":
        from mlx_vlm.reranker_loader import load_sequence_classification_model

        return load_sequence_classification_model(path, config=config)
    from mlx_vlm.embedding_loader import load_embedding_model

    # Dense modules' weights sit in their folders: read here, not by the encoder
    return load_embedding_model(path, strict=not detect.dense_dirs(path))


def _kind(path: Path, config: dict) -> str:
    if detect.is_cross_encoder(config):
        return "cross"
    if detect.is_generative_reranker(path, config):
        return "generative"
    return "encoder" if config.get("model_type") in detect.ENCODERS else "decoder"


def max_positions(config: dict) -> int:
    """The most tokens one input may have: XLM-R's positions start past its pad id, so
    its ``max_position_embeddings`` counts ``pad_token_id + 1`` slots no token can use."""
    positions = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in ("xlm-roberta", "xlm_roberta"):
        return positions - int(config.get("pad_token_id", 1)) - 1
    return positions


def _appends_eos(path: Path, config: dict, kind: str) -> bool:
    """Whether a decoder embedder reads its vector at an EOS the tokenizer file does not
    add: Qwen3-Embedding always, others when ``tokenizer_config.json`` says
    ``add_eos_token`` (transformers applies it; ``tokenizers`` alone does not)."""
    if kind != "decoder":
        return False
    tok_config = detect._json(path / "tokenizer_config.json") or {}
    return config.get("model_type") == "qwen3" or bool(tok_config.get("add_eos_token"))


def load(path: Path, options: LoadOptions) -> Loaded:
    """The checkpoint ready for its task (``options.task``, else its own)."""
    path = Path(path)
    config = detect._json(path / "config.json") or {}
    kind = _kind(path, config)
    module = _module(path, kind, config)
    dtype = _DTYPES.get(options.dtype)
    if dtype is not None:
        module.set_dtype(dtype)
    module.eval()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    eos = config.get("eos_token_id")
    model = EmbeddingModel(
        module=module, kind=kind,
        pooling=detect.pooling_of(path, "last" if kind == "decoder" else "mean"),
        pad_id=int(config.get("pad_token_id") or 0),
        eos_id=eos[0] if isinstance(eos, list) else eos,
        max_length=max_positions(config),
        dense=[_dense(folder) for folder in detect.dense_dirs(path)],
        append_eos=_appends_eos(path, config, kind),
        # XLM-R has one token type: a tokenizer's pair type 1 would index past its table
        token_types=int(config.get("type_vocab_size") or 0) > 1)
    return Loaded(model=model, tasks=detect.tasks_of(path, config), config=config,
                  tokenizer=tokenizer)
