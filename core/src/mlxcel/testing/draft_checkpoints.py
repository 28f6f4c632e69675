"""Draft checkpoints for tests of the draft-model drafter (``mlxcel.drafters.model``).

``draft_pair``: a target whose upper layers write little into the residual stream (their
output projections scaled down) and its ``truncated_copy``, the target's first layers with its embeddings, final norm, output
projection and tokenizer -- the same vocabulary, and a model that mostly agrees with the
target (high acceptance). A different random model of the same shape and tokenizer is a
``cached_checkpoint`` with another seed (low acceptance).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
from typing import Any

from .checkpoint import build_once, default_cache_dir

_LAYER = re.compile(r"\.layers\.(\d+)\.")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def quiet_upper(source: pathlib.Path, start: int, scale: float,
                cache_dir: Any = None) -> pathlib.Path:
    """``source`` with the output projections (``o_proj``, ``down_proj``) of layers
    ``start`` and up multiplied by ``scale``, built once under ``cache_dir``: a target
    that its first ``start`` layers predict well."""
    import mlx.core as mx

    source = pathlib.Path(source)
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build(tmp: pathlib.Path) -> None:
        weights = mx.load(str(source / "model.safetensors"))
        for k, v in weights.items():
            m = _LAYER.search(k)
            if m and int(m.group(1)) >= start and k.endswith(("o_proj.weight",
                                                               "down_proj.weight")):
                weights[k] = (v * scale).astype(v.dtype)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        for name in ("config.json", *TOKENIZER_FILES):
            if (source / name).is_file():
                shutil.copy(source / name, tmp / name)

    return build_once(root / f"{source.name}-quiet{start}x{scale}", build)


def draft_pair(cache_dir: Any = None, layers: int = 4, keep: int = 2,
               scale: float = 0.3) -> tuple[pathlib.Path, pathlib.Path]:
    """(target, draft): a tiny qwen3 of ``layers`` layers (EOS suppressed) whose layers
    from ``keep`` up are quiet, and its first ``keep`` layers."""
    from .checkpoint import cached_checkpoint

    base = cached_checkpoint("qwen3", cache_dir, num_layers=layers, suppress_eos=True)
    target = quiet_upper(base, keep, scale, cache_dir)
    return target, truncated_copy(target, keep, cache_dir)


def truncated_copy(source: pathlib.Path, layers: int, cache_dir: Any = None) -> pathlib.Path:
    """``source`` (a text checkpoint with ``num_hidden_layers``) cut to its first
    ``layers`` layers, built once under ``cache_dir``."""
    import mlx.core as mx

    source = pathlib.Path(source)
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build(tmp: pathlib.Path) -> None:
        weights = mx.load(str(source / "model.safetensors"))
        kept = {k: v for k, v in weights.items()
                if (m := _LAYER.search(k)) is None or int(m.group(1)) < layers}
        mx.save_safetensors(str(tmp / "model.safetensors"), kept, metadata={"format": "mlx"})
        config = json.loads((source / "config.json").read_text())
        config["num_hidden_layers"] = layers
        (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, tmp / name)

    return build_once(root / f"{source.name}-first{layers}", build)
