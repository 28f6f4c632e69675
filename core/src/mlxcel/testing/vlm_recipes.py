"""What each tiny VLM checkpoint of ``mlxcel.testing.vlm_checkpoints`` holds, per shape: its
special tokens, ``config.json``, processor files and the checkpoint's weight names.

Field names are the Hub checkpoints' own (Qwen/Qwen2-VL-2B-Instruct,
Qwen/Qwen2.5-VL-3B-Instruct, google/gemma-3-4b-it, google/gemma-4-E2B-it), with tiny sizes
chosen so that a 56x56 image becomes a handful of image tokens: 4 for Qwen2-VL and
Qwen2.5-VL (one 28x28 merged patch per token), 4 for Gemma 3 (a fixed count per image) and
9 for Gemma 4 (a 48x48 resize under a 10-token budget). ``MORE_SHAPES`` (LLaVA-1.5, SmolVLM,
Mistral 3) are ``vlm_recipes_more``'s. Plain data: importing this module imports nothing
heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                 "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                 "<|image_pad|>", "<|video_pad|>")
GEMMA3_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                   "<start_of_image>", "<end_of_image>", "<image_soft_token>")
# Gemma 4's named tokens (tokenizer_config.json's ``*_token`` fields) and <|video|>
GEMMA4_NAMED = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>",
                "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>",
                "eoc_token": "<channel|>", "think_token": "<|think|>", "escape_token": '<|"|>',
                "stc_token": "<|tool_call>", "etc_token": "<tool_call|>",
                "std_token": "<|tool>", "etd_token": "<tool|>",
                "str_token": "<|tool_response>", "etr_token": "<tool_response|>"}
GEMMA4_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>",
                   *GEMMA4_NAMED.values(), "<|video|>")
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class Dims:
    """The text model's sizes (the vision tower's are each recipe's own)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    inter: int = 128
    vocab: int = 512

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Recipe:
    """One shape. ``config(ids, dims)``: config.json from the special tokens' ids.
    ``files``: processor files (name -> JSON). ``tokenizer``: tokenizer_config.json's
    extra fields. ``to_hub(key)``: an mlx-vlm parameter's name in the checkpoint (None:
    not saved, a tied head); ``transposed``: those saved in PyTorch's layout, as the
    permutation from mlx-vlm's. ``tied``: the output head is the embeddings."""

    specials: tuple[str, ...]
    bos: str | None
    eos: tuple[str, ...]
    pad: str
    template: str
    chat_template_file: str
    config: Callable[[dict[str, int], Dims], dict[str, Any]]
    files: dict[str, dict[str, Any]]
    tokenizer: dict[str, Any] = field(default_factory=dict)
    to_hub: Callable[[str], str | None] = lambda k: k
    transposed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tied: bool = True


def _qwen_text(d: Dims, ids: dict[str, int], arch: str, model_type: str) -> dict[str, Any]:
    half = d.head_dim // 2  # M-RoPE: temporal, height and width sections of the rotary half
    t = half // 4
    return {
        "architectures": [arch], "model_type": model_type, "hidden_size": d.hidden,
        "intermediate_size": d.inter, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "vocab_size": d.vocab, "max_position_embeddings": 32768, "max_window_layers": d.layers,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [t, (half - t) // 2,
                                                            half - t - (half - t) // 2]},
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"], "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
    }


def _qwen2_vl(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    return {**_qwen_text(d, ids, "Qwen2VLForConditionalGeneration", "qwen2_vl"),
            "vision_config": {"depth": 2, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2,
                              "in_chans": 3, "hidden_size": d.hidden, "patch_size": 14,
                              "spatial_merge_size": 2, "spatial_patch_size": 14,
                              "temporal_patch_size": 2}}


def _qwen2_5_vl(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    return {**_qwen_text(d, ids, "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"),
            "vision_config": {"depth": 2, "hidden_act": "silu", "hidden_size": 32,
                              "intermediate_size": 64, "num_heads": 2, "in_chans": 3,
                              "out_hidden_size": d.hidden, "patch_size": 14,
                              "spatial_merge_size": 2, "spatial_patch_size": 14,
                              "window_size": 56, "fullatt_block_indexes": [1],
                              "tokens_per_second": 2, "temporal_patch_size": 2}}


def _qwen_files(processor: str) -> dict[str, dict[str, Any]]:
    # min_pixels/max_pixels: a 56x56 image stays 56x56 (2x2 merged patches); at most 4x4
    return {"preprocessor_config.json": {
        "min_pixels": 56 * 56, "max_pixels": 112 * 112, "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD, "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor}}


def _qwen_key(key: str) -> str:
    """mlx-vlm's name -> Qwen2-VL's (the inverse of its ``Model.sanitize``)."""
    if key.startswith("vision_tower."):
        return "visual." + key.removeprefix("vision_tower.")
    return key.removeprefix("language_model.")


def _gemma3(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    text = {"model_type": "gemma3_text", "hidden_size": d.hidden, "intermediate_size": d.inter,
            "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim,
            "query_pre_attn_scalar": d.head_dim, "vocab_size": d.vocab, "sliding_window": 16,
            "sliding_window_pattern": 2, "rope_scaling": None, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            # HF reads it at the top level, mlx-vlm's projector from text_config
            "mm_tokens_per_image": 4}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": ids["<start_of_image>"], "eoi_token_index": ids["<end_of_image>"],
            "image_token_index": ids["<image_soft_token>"], "mm_tokens_per_image": 4,
            "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]], "bos_token_id": ids["<bos>"],
            "pad_token_id": ids["<pad>"], "vocab_size": d.vocab,
            "initializer_range": 0.02, "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32,
                              "intermediate_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "patch_size": 7, "image_size": 28,
                              "layer_norm_eps": 1e-6, "vision_use_head": False}}


GEMMA3_FILES = {
    "preprocessor_config.json": {
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None,
        "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 4,
        "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": 28, "width": 28}},
    "processor_config.json": {"image_seq_length": 4, "processor_class": "Gemma3Processor"},
}


def _gemma4(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    layers = 2 * d.layers  # the later half reuse the earlier half's KV
    text = {"model_type": "gemma4_text", "hidden_size": d.hidden, "intermediate_size": d.inter,
            "num_hidden_layers": layers, "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim,
            "global_head_dim": 2 * d.head_dim, "vocab_size": d.vocab,
            "vocab_size_per_layer_input": d.vocab, "hidden_size_per_layer_input": d.head_dim,
            "num_kv_shared_layers": d.layers, "sliding_window": 16,
            "layer_types": ["sliding_attention" if (layers - 1 - i) % 2 else "full_attention"
                            for i in range(layers)],
            "use_double_wide_mlp": False, "enable_moe_block": False,
            "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "pad_token_id": ids["<pad>"],
            "tie_word_embeddings": True, "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}
    vision = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "head_dim": 16, "global_head_dim": 16, "patch_size": 8,
              "pooling_kernel_size": 2, "position_embedding_size": 64,
              "default_output_length": 10, "rms_norm_eps": 1e-6, "standardize": False,
              "use_clipped_linears": False,
              "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}}
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
            "audio_config": None, "text_config": text, "vision_config": vision,
            "image_token_id": ids["<|image|>"], "boi_token_id": ids["<|image>"],
            "eoi_token_id": ids["<image|>"], "audio_token_id": ids["<|audio|>"],
            "boa_token_id": ids["<|audio>"], "eoa_token_id": ids["<audio|>"],
            "video_token_id": ids["<|video|>"], "vision_soft_tokens_per_image": 10,
            "eos_token_id": [ids["<eos>"], ids["<turn|>"]], "bos_token_id": ids["<bos>"],
            "pad_token_id": ids["<pad>"], "tie_word_embeddings": True,
            "vocab_size": d.vocab, "initializer_range": 0.02}


GEMMA4_FILES = {"processor_config.json": {
    "processor_class": "Gemma4Processor", "image_seq_length": 10,
    "audio_seq_length": 750, "audio_ms_per_token": 40,
    "image_processor": {
        "image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True,
        "do_normalize": False, "do_rescale": True, "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "resample": 3,
        "rescale_factor": 1 / 255, "max_soft_tokens": 10, "patch_size": 8,
        "pooling_kernel_size": 2},
    "video_processor": {"video_processor_type": "Gemma4VideoProcessor",
                        "max_soft_tokens": 70, "patch_size": 8, "pooling_kernel_size": 2}}}


def _gemma4_key(key: str) -> str | None:
    """mlx-vlm's name -> Gemma 4's (``model.`` over the towers and ``language_model``)."""
    if key.startswith("language_model.lm_head."):
        return None
    return "model." + key.replace("language_model.model.", "language_model.", 1)


RECIPES: dict[str, Recipe] = {
    "qwen2_vl": Recipe(
        specials=QWEN_SPECIALS, bos=None, eos=("<|im_end|>", "<|endoftext|>"),
        pad="<|endoftext|>", template="qwen2_vl.jinja", chat_template_file="chat_template.json",
        config=_qwen2_vl, files=_qwen_files("Qwen2VLProcessor"), to_hub=_qwen_key,
        transposed={"visual.patch_embed.proj.weight": (0, 4, 1, 2, 3)}),
    "qwen2_5_vl": Recipe(
        specials=QWEN_SPECIALS, bos=None, eos=("<|im_end|>", "<|endoftext|>"),
        pad="<|endoftext|>", template="qwen2_vl.jinja", chat_template_file="chat_template.json",
        config=_qwen2_5_vl, files=_qwen_files("Qwen2_5_VLProcessor"), to_hub=_qwen_key,
        transposed={"visual.patch_embed.proj.weight": (0, 4, 1, 2, 3)}),
    "gemma3": Recipe(
        specials=GEMMA3_SPECIALS, bos="<bos>", eos=("<eos>", "<end_of_turn>"), pad="<pad>",
        template="gemma3.jinja", chat_template_file="chat_template.json", config=_gemma3,
        files=GEMMA3_FILES,
        tokenizer={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                   "image_token": "<image_soft_token>", "processor_class": "Gemma3Processor",
                   "extra_special_tokens": {"boi_token": "<start_of_image>",
                                            "eoi_token": "<end_of_image>",
                                            "image_token": "<image_soft_token>"}},
        to_hub=lambda k: None if k == "language_model.lm_head.weight" else k,
        transposed={"vision_tower.vision_model.embeddings.patch_embedding.weight":
                    (0, 3, 1, 2)}),
    "gemma4": Recipe(
        specials=GEMMA4_SPECIALS, bos="<bos>", eos=("<eos>", "<turn|>"), pad="<pad>",
        template="gemma4.jinja", chat_template_file="chat_template.jinja", config=_gemma4,
        files=GEMMA4_FILES,
        tokenizer={**GEMMA4_NAMED, "mask_token": "<mask>", "padding_side": "left",
                   "processor_class": "Gemma4Processor",
                   "extra_special_tokens": {**GEMMA4_NAMED, "video_token": "<|video|>"}},
        to_hub=_gemma4_key),
}
SHAPES = tuple(RECIPES)

# the processors that expand an image in the prompt text (LLaVA, SmolVLM, Mistral 3): kept
# in their own module, listed apart so that SHAPES stays the set the checkpoint tests know
from .vlm_recipes_more import MORE_RECIPES  # noqa: E402

MORE_SHAPES = tuple(MORE_RECIPES)
RECIPES.update(MORE_RECIPES)
