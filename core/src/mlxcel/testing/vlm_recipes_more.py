"""More tiny VLM shapes for ``mlxcel.testing.vlm_checkpoints``: the processors that expand
an image in the prompt text themselves (the vlm family's ``text`` rule), each with its
own way of writing an image.

- ``llava_1_5`` (llava-hf/llava-1.5-7b-hf: CLIP tower, Llama text): ``<image>`` becomes a
  fixed run of ``<image>`` tokens, (28/14)**2 = 4 for a 28x28 crop, whatever the image.
- ``smolvlm`` (HuggingFaceTB/SmolVLM-256M-Instruct, ``model_type`` ``idefics3``: SigLIP
  tower, Llama text): the image is resized to a 56 px longest edge and split into 28 px
  tiles, each ``<fake_token_around_image><row_R_col_C>`` and 4 ``<image>`` tokens, then the
  whole image as ``<global-img>`` and 4 more; a 56x56 image gives 2x2 tiles (20 image
  tokens), a 56x28 one 1x2 (12), so images of one prompt grow it unequally.
- ``mistral3`` (mistralai/Mistral-Small-3.1-24B-Instruct-2503: Pixtral tower, Mistral
  text): ``[IMG]`` becomes rows of ``[IMG]`` tokens (one per 2x2 merged 7 px patches), each
  row closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``; a 56x56 image gives 4x4 rows.

Field names are the Hub checkpoints' own (config.json, preprocessor_config.json,
processor_config.json, tokenizer_config.json: as those repositories have them, and as the
transformers and mlx-vlm classes that read them name them); sizes are tiny. Plain data, like
``vlm_recipes``, which lists these shapes in ``MORE_SHAPES``.
"""

from __future__ import annotations

from typing import Any

from .vlm_recipes import CLIP_MEAN, CLIP_STD, Dims, Recipe

LLAVA_SPECIALS = ("<unk>", "<s>", "</s>", "<image>", "<pad>")
# SmolLM2's named tokens, Idefics3's image tokens and the 6x6 tile markers of SmolVLM
ROW_COL = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
SMOLVLM_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                    "<fake_token_around_image>", "<image>", "<end_of_utterance>",
                    "<global-img>", *ROW_COL)
# Tekken's first control tokens, in their order (ids 0..14 on the Hub)
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]",
                    "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
                    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]")


def _llama(d: Dims, **extra: Any) -> dict[str, Any]:
    return {"model_type": "llama", "hidden_size": d.hidden, "intermediate_size": d.inter,
            "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads, "vocab_size": d.vocab, **extra}


def _llava(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    return {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
            "ignore_index": -100, "image_token_index": ids["<image>"],
            "pad_token_id": ids["<pad>"], "projector_hidden_act": "gelu",
            "tie_word_embeddings": False, "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default", "vocab_size": d.vocab,
            "text_config": _llama(d, architectures=["LlamaForCausalLM"],
                                  max_position_embeddings=4096, rms_norm_eps=1e-5),
            "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32,
                              "intermediate_size": 64, "num_attention_heads": 2,
                              "num_hidden_layers": 2, "image_size": 28, "patch_size": 14,
                              "projection_dim": 32, "vocab_size": d.vocab}}


LLAVA_FILES = {
    "preprocessor_config.json": {
        "crop_size": {"height": 28, "width": 28}, "do_center_crop": True,
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_processor_type": "CLIPImageProcessor",
        "image_std": CLIP_STD, "processor_class": "LlavaProcessor", "resample": 3,
        "rescale_factor": 1 / 255, "size": {"shortest_edge": 28}},
    "processor_config.json": {
        "image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
        "processor_class": "LlavaProcessor", "vision_feature_select_strategy": "default"},
}


def _smolvlm(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    return {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
            "image_token_id": ids["<image>"], "scale_factor": 2, "tie_word_embeddings": False,
            "vocab_size": d.vocab, "pad_token_id": ids["<|im_end|>"],
            "text_config": _llama(d, architectures=["VLlama3ForCausalLM"],
                                  head_dim=d.head_dim, max_position_embeddings=8192,
                                  rms_norm_eps=1e-5, rope_theta=100000.0,
                                  pad_token_id=ids["<|im_end|>"], tie_word_embeddings=False),
            "vision_config": {"model_type": "idefics3_vision", "hidden_size": 32,
                              "intermediate_size": 64, "num_attention_heads": 2,
                              "num_hidden_layers": 2, "image_size": 28, "patch_size": 7,
                              "max_image_size": {"longest_edge": 28},
                              "size": {"longest_edge": 56}}}


SMOLVLM_FILES = {
    "preprocessor_config.json": {
        "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True,
        "do_pad": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Idefics3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": 28}, "processor_class": "Idefics3Processor",
        "resample": 1, "rescale_factor": 1 / 255, "size": {"longest_edge": 56}},
    "processor_config.json": {"image_seq_len": 4, "processor_class": "Idefics3Processor"},
}


def _smolvlm_key(key: str) -> str:
    """mlx-vlm's name -> Idefics3's (the inverse of its ``Model.sanitize``)."""
    if key.startswith("language_model.lm_head."):
        return key.removeprefix("language_model.")
    if key.startswith("language_model."):
        return "model.text_model." + key.removeprefix("language_model.")
    return "model." + key


def _mistral3(ids: dict[str, int], d: Dims) -> dict[str, Any]:
    text = {"model_type": "mistral", "hidden_size": d.hidden, "intermediate_size": d.inter,
            "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "vocab_size": d.vocab,
            "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000000.0, "sliding_window": None, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True}
    vision = {"model_type": "pixtral", "hidden_size": 32, "head_dim": 16,
              "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2,
              "num_channels": 3, "image_size": 56, "patch_size": 7, "hidden_act": "silu",
              "rope_theta": 10000.0, "attention_dropout": 0.0, "initializer_range": 0.02}
    return {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "image_token_index": ids["[IMG]"], "multimodal_projector_bias": False,
            "projector_hidden_act": "gelu", "spatial_merge_size": 2,
            "vision_feature_layer": -1, "text_config": text, "vision_config": vision}


MISTRAL3_FILES = {
    "preprocessor_config.json": {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_processor_type": "PixtralImageProcessor",
        "image_std": CLIP_STD, "patch_size": {"height": 7, "width": 7},
        "processor_class": "PixtralProcessor", "resample": 3, "rescale_factor": 1 / 255,
        "size": {"longest_edge": 56}},
    "processor_config.json": {
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
        "image_token": "[IMG]", "patch_size": 7, "processor_class": "PixtralProcessor",
        "spatial_merge_size": 2},
}


def _mistral3_key(key: str) -> str:
    """mlx-vlm's name -> Mistral3's (the inverse of its ``Model.sanitize``: the Pixtral
    tower's modules sit right under ``vision_tower``)."""
    return key.replace("vision_tower.vision_model.", "vision_tower.", 1)


MORE_RECIPES: dict[str, Recipe] = {
    "llava_1_5": Recipe(
        specials=LLAVA_SPECIALS, bos="<s>", eos=("</s>",), pad="<pad>",
        template="llava.jinja", chat_template_file="chat_template.json", config=_llava,
        files=LLAVA_FILES, tokenizer={"processor_class": "LlavaProcessor",
                                      "padding_side": "left"},
        transposed={"vision_tower.vision_model.embeddings.patch_embedding.weight":
                    (0, 3, 1, 2)},
        tied=False),
    "smolvlm": Recipe(
        specials=SMOLVLM_SPECIALS, bos=None, eos=("<end_of_utterance>", "<|im_end|>"),
        pad="<|im_end|>", template="smolvlm.jinja", chat_template_file="chat_template.json",
        config=_smolvlm, files=SMOLVLM_FILES,
        tokenizer={"bos_token": "<|im_start|>", "processor_class": "Idefics3Processor",
                   "additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                 "<end_of_utterance>"]},
        to_hub=_smolvlm_key,
        transposed={"model.vision_model.embeddings.patch_embedding.weight": (0, 3, 1, 2)},
        tied=False),
    "mistral3": Recipe(
        specials=MISTRAL_SPECIALS, bos="<s>", eos=("</s>",), pad="<pad>",
        template="mistral3.jinja", chat_template_file="chat_template.json",
        config=_mistral3, files=MISTRAL3_FILES,
        tokenizer={"processor_class": "PixtralProcessor"}, to_hub=_mistral3_key,
        transposed={"vision_tower.patch_conv.weight": (0, 3, 1, 2)}, tied=False),
}
