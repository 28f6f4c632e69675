"""The tiny VLM checkpoints of ``mlxcel.testing.vlm_checkpoints`` are what the Hub has:
mlx-vlm loads them offline, their weights sit under the checkpoint's own names and
layouts, their processor expands an image into the model's image tokens, and a prompt
with one image runs through mlx-vlm's own model."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlxcel.testing.vlm_checkpoints import SHAPES, init_model
from mlxcel.testing.vlm_reference import forward, prompt_inputs, ramp_image
from PIL import Image

# a 56x56 image -> image tokens: Qwen merges 2x2 patches of 14 px (56/28 squared), Gemma 3
# pools its 4x4 patches to mm_tokens_per_image, Gemma 4 resizes to 48x48 under a budget of
# 10 soft tokens (6x6 patches of 8 px, pooled 2x2)
TOKENS_56 = {"qwen2_vl": 4, "qwen2_5_vl": 4, "gemma3": 4, "gemma4": 9}
IMAGE_TOKEN = {"qwen2_vl": "<|image_pad|>", "qwen2_5_vl": "<|image_pad|>",
               "gemma3": "<image_soft_token>", "gemma4": "<|image|>"}
# what the chat template writes for an image part, before the processor expands it
RENDERED = {"qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
            "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
            "gemma3": "<start_of_image>", "gemma4": "<|image|>"}
# weights under the Hub's names, convolutions in PyTorch's [out, in, ...] layout
HUB_KEYS = {
    "qwen2_vl": {"visual.patch_embed.proj.weight": (32, 3, 2, 14, 14),
                 "model.embed_tokens.weight": (512, 64)},
    "qwen2_5_vl": {"visual.patch_embed.proj.weight": (32, 3, 2, 14, 14),
                   "model.layers.0.self_attn.q_proj.bias": (64,)},
    "gemma3": {"vision_tower.vision_model.embeddings.patch_embedding.weight": (32, 3, 7, 7),
               "language_model.model.embed_tokens.weight": (512, 64),
               "multi_modal_projector.mm_input_projection_weight": (32, 64)},
    "gemma4": {"model.language_model.embed_tokens.weight": (512, 64),
               "model.vision_tower.patch_embedder.input_proj.weight": (32, 192),
               "model.embed_vision.embedding_projection.weight": (64, 32)},
}


def image_tokens(processor, ids, shape: str) -> int:
    token = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[shape])
    return int((ids == token).sum().item())


@pytest.mark.parametrize("shape", SHAPES)
def test_weights_are_under_the_checkpoints_own_names(vlm_checkpoint, shape):
    weights = mx.load(str(vlm_checkpoint(shape) / "model.safetensors"))
    for key, dims in HUB_KEYS[shape].items():
        assert key in weights, f"{shape}: no {key}"
        assert weights[key].shape == dims, (key, weights[key].shape)
    assert not any(k.endswith("lm_head.weight") for k in weights), "a tied head was saved"


@pytest.mark.parametrize("shape", SHAPES)
def test_mlx_vlm_loads_it_back_with_the_same_logits(vlm_checkpoint, shape):
    from mlx_vlm.utils import load

    path = vlm_checkpoint(shape)
    model, processor = load(str(path))  # strict: every weight found, none left over
    _, inputs = prompt_inputs(processor, [ramp_image()])
    built = init_model(json.loads((path / "config.json").read_text()))
    loaded, expected = forward(model, inputs), forward(built, inputs)
    assert loaded.shape == (1, inputs["input_ids"].shape[1], 512)
    assert mx.array_equal(loaded, expected).item(), f"{shape}: the saved weights differ"


@pytest.mark.parametrize("shape", SHAPES)
def test_the_processor_expands_an_image_into_the_models_image_tokens(vlm_checkpoint, shape):
    from mlx_vlm.utils import load_processor

    processor = load_processor(vlm_checkpoint(shape))
    text, inputs = prompt_inputs(processor, [ramp_image()])
    assert RENDERED[shape] in text, text
    assert image_tokens(processor, inputs["input_ids"], shape) == TOKENS_56[shape]


@pytest.mark.parametrize("shape", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_image_tokens_follow_the_image_grid(vlm_checkpoint, shape):
    """A 112x56 image is a 8x4 grid of 14 px patches (image_grid_thw), 2x2 per token."""
    from mlx_vlm.utils import load_processor

    processor = load_processor(vlm_checkpoint(shape))
    _, inputs = prompt_inputs(processor, [ramp_image(56, 112)])
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 4]]
    assert image_tokens(processor, inputs["input_ids"], shape) == 8


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prompt_with_one_image_gives_finite_logits(vlm_checkpoint, shape):
    from mlx_vlm.utils import load

    model, processor = load(str(vlm_checkpoint(shape)))
    _, inputs = prompt_inputs(processor, [ramp_image()])
    logits = forward(model, inputs)
    assert logits.shape == (1, inputs["input_ids"].shape[1], 512)
    assert mx.all(mx.isfinite(logits)).item()
    # the image changes what follows it: another image, other logits at the last position
    _, other = prompt_inputs(processor, [ramp_image().transpose(Image.Transpose.ROTATE_90)])
    assert not mx.allclose(forward(model, other)[0, -1], logits[0, -1]).item()


def test_an_unknown_shape_is_refused(tmp_path):
    from mlxcel.testing.vlm_checkpoints import build_vlm

    with pytest.raises(ValueError, match="qwen2_vl"):
        build_vlm(tmp_path, "llava")
    with pytest.raises(ValueError, match="hidden_size"):
        build_vlm(tmp_path, "qwen2_vl", hidden=8)
