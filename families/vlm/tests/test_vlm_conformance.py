"""The family passes mlxcel's conformance runners on tiny VLM checkpoints: the server
selects it, text rows batch (batched greedy equals solo greedy) and reuse the prompt
cache, and its decoder keeps the media contract on image rows."""

from __future__ import annotations

import io

import numpy as np
import pytest
from mlxcel.media.api import MediaLimits
from mlxcel.media.image import decode
from mlxcel.testing.conformance import check_family, check_media_model
from mlxcel.types.media import MediaBlob
from PIL import Image

# what each checkpoint's chat template prints for an image part
MARKS = {"qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
         "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
         "gemma3": "<start_of_image>",
         # the processor expands these in the text (the ``text`` rule)
         "llava_1_5": "<image>\n", "smolvlm": "<image>", "mistral3": "[IMG]"}


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    pixels = (np.random.default_rng(seed).random((56, 56, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("shape", ["qwen2_vl", "gemma3", "llava_1_5", "smolvlm", "mistral3"])
def test_family_conforms_on_text_rows(vlm_checkpoint, shape):
    check_family(vlm_checkpoint(shape), "vlm")


@pytest.mark.parametrize("shape", sorted(MARKS))
def test_decoder_keeps_the_media_contract(vlm_checkpoint, shape):
    from tokenizers import Tokenizer

    path = vlm_checkpoint(shape)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    mark = MARKS[shape]
    ids = tok.encode(f"Look {mark} and {mark}: what differs between the two pictures, "
                     "in colour, in shape and in the light? Answer in one short sentence.",
                     add_special_tokens=False).ids
    items = [decode(MediaBlob.of(_png(s), "image/png", "data"), MediaLimits()) for s in (1, 2)]
    check_media_model(path, items, ids)
