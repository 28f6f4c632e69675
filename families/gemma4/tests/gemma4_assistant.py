"""A tiny random-weight ``gemma4_assistant`` checkpoint for a tiny Gemma 4 target.

Built as mlxcel's tiny checkpoints are (``mlxcel.testing.checkpoint``): mlx-vlm's own
model class (``mlx_vlm.speculative.drafters.gemma4_assistant``) with seeded weights and
a config.json of the real shape (top level plus ``text_config``), whose attention sizes
are the target's, since the assistant attends to the target's keys and values.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

ATTENTION = ("num_attention_heads", "num_key_value_heads", "head_dim", "global_head_dim",
             "sliding_window", "vocab_size", "rms_norm_eps", "rope_theta",
             "max_position_embeddings")


def assistant_config(target: dict[str, Any], hidden: int, layers: int) -> dict[str, Any]:
    """The assistant's config.json for ``target``'s (a gemma4_text config): its own
    width and depth, the target's attention sizes and vocabulary."""
    kinds = ("sliding_attention", "full_attention")
    text = {"model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "intermediate_size": 2 * hidden, "layer_types": [kinds[i % 2] for i in range(layers)],
            "num_kv_shared_layers": layers, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": target["vocab_size"], "enable_moe_block": False,
            "use_double_wide_mlp": False, "final_logit_softcapping": None,
            **{k: target[k] for k in ATTENTION if k in target}}
    return {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"],
            "backbone_hidden_size": target["hidden_size"], "tie_word_embeddings": True,
            "use_ordered_embeddings": False, "block_size": 4, "text_config": text}


def build_assistant(path: pathlib.Path, target: pathlib.Path, hidden: int = 32,
                    layers: int = 2, seed: int = 1) -> pathlib.Path:
    """Write the assistant checkpoint for the target checkpoint at ``target`` into
    ``path`` (float32 weights, seeded) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.speculative.drafters import gemma4_assistant

    config = assistant_config(json.loads((target / "config.json").read_text()), hidden,
                              layers)
    mx.random.seed(seed)
    model = gemma4_assistant.Model(gemma4_assistant.ModelConfig.from_dict(config))
    model.set_dtype(mx.float32)
    path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
