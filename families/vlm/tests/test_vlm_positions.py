"""An image prompt's M-RoPE positions, computed on the host, are mlx-vlm's own."""

from __future__ import annotations

import io

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.media.api import MediaLimits
from mlxcel.media.image import decode
from mlxcel.types.media import MediaBlob
from mlxcel_family_vlm.load import decoder, load
from mlxcel_family_vlm.positions import HOST_RULE
from PIL import Image


def item(seed: int, size: tuple[int, int]):
    out = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(out, "PNG")
    return decode(MediaBlob.of(out.getvalue(), "image/png", "data"), MediaLimits())


@pytest.mark.parametrize("shape", HOST_RULE)
@pytest.mark.parametrize("layout", ["one", "two", "leading-text"])
def test_host_positions_are_get_rope_indexs(vlm_checkpoint, shape, layout):
    model = decoder(load(vlm_checkpoint(shape), LoadOptions()))
    assert model._host_rule() is not None  # the host rule is the one in use
    encode = model.processor.tokenizer.encode
    pad = model.media_placeholder("image")
    texts = {"one": f"{pad} What is this?",
             "two": f"{pad} and {pad}, compared in a few words",
             "leading-text": f"Some words before the picture: {pad} then a question"}
    ids = list(encode(texts[layout], add_special_tokens=False))
    images = [item(1, (56, 84)), item(2, (112, 56))][:texts[layout].count(pad)]
    prompt = model.expand_media(ids, images, {})
    got, delta = model.media_positions(prompt)
    grid = mx.array(prompt.inputs["image_grid_thw"])
    want, deltas = model.language_model.get_rope_index(
        mx.array(prompt.token_ids, dtype=mx.int32)[None], grid)
    assert got.shape == want.shape
    assert mx.array_equal(got, want.astype(got.dtype)).item()
    assert delta == int(mx.array(deltas).reshape(-1)[0].item())
    assert delta != 0  # the images moved the text after them
