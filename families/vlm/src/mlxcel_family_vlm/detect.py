"""Which checkpoints this family owns: read from ``config.json`` only (no MLX import, no
weight read), since it runs in the CLI before the server forks.

``MODEL_TYPES`` are the checkpoint ``model_type`` spellings of the vision-language models
that mlx-vlm 0.7.10 loads (``mlx_vlm.utils.get_model_type`` maps the hyphenated and
renamed ones onto its modules) whose language model is a plain decoder. Left out: ``gemma4``
(``mlxcel-family-gemma4`` owns it, and two families may not list one type), Florence-2
(an encoder-decoder, a family of its own), embedders and rerankers (``qwen3_vl_embedding``,
``colqwen2_5``, ...: ``mlxcel-family-embeddings``), detectors and segmenters, and the
hybrid or cross-attention decoders (``qwen3_5``, ``llama4``, ``mllama``, ``kimi_k25``, ...),
which mlx-lm's text path serves today and which need the engine's image rows first.
"""

from __future__ import annotations

from pathlib import Path

MODEL_TYPES = (
    # Qwen-VL: M-RoPE positions
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    # Gemma: SigLIP towers
    "gemma3", "gemma3n", "paligemma",
    # Idefics / SmolVLM
    "idefics2", "idefics3", "smolvlm",
    # LLaVA and its kin (Bunny, FastVLM)
    "llava", "llava_next", "llava_onevision", "llava-qwen2", "bunny-llama", "llava_qwen2",
    # Mistral
    "mistral3", "pixtral",
    # others
    "aya_vision", "cohere2_vision", "deepseek_vl_v2", "glm4v", "glm4v_moe", "kimi_vl",
    "lfm2_vl", "lfm2-vl", "phi3_v", "internvl_chat",
)
# where a checkpoint describes its vision tower (Phi-3-vision: ``img_processor``)
VISION_KEYS = ("vision_config", "img_processor")


def check(path: Path, config: dict) -> bool | str:
    """A vision-language checkpoint of a listed type, with its vision tower's config; not
    a text-only one sharing the type, nor an embedder or classifier built on it."""
    from mlxcel.families.text import side_model_reason

    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        return f"model_type '{model_type}' is not a vision-language model this family serves"
    if not any(isinstance(config.get(key), dict) for key in VISION_KEYS):
        return f"a {model_type} checkpoint without a vision tower (no vision_config)"
    return side_model_reason(Path(path), config) or True
