"""The tiny checkpoints of ``vlm_checkpoints.MORE_SHAPES`` (LLaVA-1.5, SmolVLM, Mistral 3)
are what the Hub has, as ``test_vlm_checkpoints`` checks of ``SHAPES``: mlx-vlm loads them
offline with every weight under the checkpoint's own name and layout, their processor
writes an image as the model's own tokens, and a prompt with an image runs."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.testing.vlm_checkpoints import MORE_SHAPES, SHAPES, init_model
from mlxcel.testing.vlm_reference import forward, prompt_inputs, ramp_image
from PIL import Image

# what the chat template writes for an image part, and what a 56x56 image becomes:
# LLaVA's 28x28 crop is 2x2 patches of 14 px (4 tokens); SmolVLM's 2x2 tiles of 28 px and
# the whole image, 4 tokens each (16 patches of 7 px, pixel-shuffled by 2); Pixtral's 8x8
# patches of 7 px, merged 2x2 into 4 rows of 4
RENDERED = {"llava_1_5": "<image>\n", "smolvlm": "<image>", "mistral3": "[IMG]"}
TOKENS_56 = {"llava_1_5": 4, "smolvlm": 20, "mistral3": 16}
MARKERS_56 = {  # the other tokens the processor writes around them
    "llava_1_5": {},
    "smolvlm": {"<fake_token_around_image>": 6, "<global-img>": 1, "<row_1_col_1>": 1,
                "<row_2_col_2>": 1},
    "mistral3": {"[IMG_BREAK]": 3, "[IMG_END]": 1},
}
# weights under the Hub's names, convolutions in PyTorch's [out, in, kh, kw] layout
HUB_KEYS = {
    "llava_1_5": {"vision_tower.vision_model.embeddings.patch_embedding.weight": (32, 3, 14, 14),
                  "vision_tower.vision_model.embeddings.class_embedding": (32,),
                  "multi_modal_projector.linear_1.weight": (64, 32),
                  "language_model.model.embed_tokens.weight": (512, 64),
                  "language_model.lm_head.weight": (512, 64)},
    "smolvlm": {"model.vision_model.embeddings.patch_embedding.weight": (32, 3, 7, 7),
                "model.connector.modality_projection.proj.weight": (64, 128),
                "model.text_model.embed_tokens.weight": (512, 64),
                "lm_head.weight": (512, 64)},
    "mistral3": {"vision_tower.patch_conv.weight": (32, 3, 7, 7),
                 "vision_tower.transformer.layers.0.attention.q_proj.weight": (32, 32),
                 "multi_modal_projector.patch_merger.merging_layer.weight": (32, 128),
                 "language_model.model.embed_tokens.weight": (512, 64),
                 "language_model.lm_head.weight": (512, 64)},
}


@pytest.fixture(scope="module", params=MORE_SHAPES)
def loaded(request, vlm_checkpoint):
    """mlx-vlm's model and processor (``load`` also installs the model module's own
    processor class), strictly: every weight found, none left over."""
    from mlx_vlm.utils import load

    path = vlm_checkpoint(request.param)
    return request.param, path, *load(str(path))


def test_the_shapes_are_apart_from_the_first_set():
    assert set(MORE_SHAPES) == set(RENDERED) and not set(MORE_SHAPES) & set(SHAPES)


def test_weights_are_under_the_checkpoints_own_names(loaded):
    shape, path, *_ = loaded
    weights = mx.load(str(path / "model.safetensors"))
    for key, dims in HUB_KEYS[shape].items():
        assert key in weights, f"{shape}: no {key}"
        assert weights[key].shape == dims, (key, weights[key].shape)
    config = json.loads((path / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == 512
    assert (path / "chat_template.json").is_file() and (path / "processor_config.json").is_file()


def test_mlx_vlm_loads_it_back_with_the_same_logits(loaded):
    shape, path, model, processor = loaded
    _, inputs = prompt_inputs(processor, [ramp_image()])
    built = init_model(json.loads((path / "config.json").read_text()))
    got, want = forward(model, inputs), forward(built, inputs)
    assert got.shape == (1, inputs["input_ids"].shape[1], 512)
    assert mx.array_equal(got, want).item(), f"{shape}: the saved weights differ"


def test_the_processor_writes_an_image_as_the_models_tokens(loaded):
    shape, _, _, processor = loaded
    text, inputs = prompt_inputs(processor, [ramp_image()])
    assert RENDERED[shape] in text, text
    ids = np.asarray(inputs["input_ids"]).reshape(-1).tolist()
    tok = processor.tokenizer
    assert ids.count(processor.image_token_id) == TOKENS_56[shape]
    for marker, count in MARKERS_56[shape].items():
        assert ids.count(tok.convert_tokens_to_ids(marker)) == count, marker


def test_a_prompt_with_one_image_gives_finite_logits(loaded):
    _, _, model, processor = loaded
    _, inputs = prompt_inputs(processor, [ramp_image()])
    logits = forward(model, inputs)
    assert mx.all(mx.isfinite(logits)).item()
    _, other = prompt_inputs(processor, [ramp_image().transpose(Image.Transpose.ROTATE_90)])
    assert not mx.allclose(forward(model, other)[0, -1], logits[0, -1]).item()
