"""Tiny DFlash draft checkpoints for tiny qwen3 and Gemma 4 targets
(``mlxcel.testing.checkpoint``).

``with_dflash`` writes what a DFlash conversion holds: a ``config.json`` whose
``model_type`` is ``qwen3`` (or ``gemma4``) with a ``dflash_config`` (mask token, target
layers) beside it, and the seeded weights of mlx-vlm's own model class for it
(``qwen3_dflash``, ``gemma4_dflash``; no embeddings nor LM head: it borrows the
target's). ``constant`` zeroes a final norm's weight, so that its
logits are all zero and greedy picks token 0 at every position: a target and a drafter
both made so agree on every token.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any


def dflash_config(target: pathlib.Path, **changes: Any) -> dict[str, Any]:
    """A one-layer DFlash config for ``target`` reading all its layers, block width 4;
    ``changes`` override its fields (``dflash_config`` whole)."""
    cfg = json.loads((target / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    config = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"],
              "hidden_size": cfg["hidden_size"], "intermediate_size": 96,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": cfg["vocab_size"],
              "rope_theta": cfg["rope_theta"], "max_position_embeddings": 4096,
              "tie_word_embeddings": True, "block_size": 4, "num_target_layers": layers,
              "dflash_config": {"mask_token_id": 3, "target_layer_ids": list(range(layers))}}
    return {**config, **changes}


def with_dflash(path: pathlib.Path, target: pathlib.Path, seed: int = 5,
                constant: bool = False, **changes: Any) -> pathlib.Path:
    """Write a random DFlash drafter for ``target`` into ``path`` (``dflash_config``'s
    ``changes``); ``constant``: its final norm zeroed."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    config = dflash_config(target, **changes)
    module = importlib.import_module(
        f"mlx_vlm.speculative.drafters.{config['model_type']}_dflash")
    mx.random.seed(seed)
    model = module.Model(module.ModelConfig.from_dict(dict(config)))
    weights = dict(tree_flatten(model.parameters()))
    if constant:
        weights["norm.weight"] = mx.zeros_like(weights["norm.weight"])
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return path


def constant_target(path: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """``target``'s checkpoint with its final norm zeroed: it says token 0 after any
    context."""
    import mlx.core as mx

    path.mkdir(parents=True, exist_ok=True)
    for file in target.iterdir():
        shutil.copy(file, path / file.name)
    weights = dict(mx.load(str(target / "model.safetensors")))
    weights["model.norm.weight"] = mx.zeros_like(weights["model.norm.weight"])
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
