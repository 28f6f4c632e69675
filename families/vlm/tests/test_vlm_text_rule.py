"""The ``text`` rule on real processors (LLaVA-1.5's, SmolVLM's and Mistral 3's, as
mlx-vlm loads them): what it makes of a chat-template prompt with two images of unlike
sizes is what the processor itself makes of it (ids, and embeddings through mlx-vlm's
``get_input_embeddings``), each image's span and growth are its own, and an image row
decodes as mlx-vlm's own generate loop does."""

from __future__ import annotations

import io

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.chat.media import expand as chat_expand
from mlxcel.engine.media_rows import FeatureCache
from mlxcel.errors import InvalidRequest
from mlxcel.families.api import LoadOptions
from mlxcel.media.api import MediaLimits
from mlxcel.media.image import decode
from mlxcel.testing.engine import engine_for, media_request, run
from mlxcel.testing.vlm_checkpoints import MORE_SHAPES
from mlxcel.testing.vlm_reference import mlx_vlm_greedy
from mlxcel.types.media import MediaBlob
from mlxcel_family_vlm import media
from mlxcel_family_vlm.load import decoder, load
from PIL import Image

# (width, height): SmolVLM tiles the first 2x2 and the second in 1 row of 2 columns,
# Pixtral makes 4 and 2 rows of 4 patch tokens, LLaVA crops both to one 28x28 square
SIZES = ((56, 56), (56, 28))
MESSAGES = [{"role": "user", "content": [
    {"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"},
    {"type": "text", "text": "What differs between the two pictures, in colour and in "
                             "shape? Answer in one short sentence, please."}]}]


def item(seed: int, size: tuple[int, int]) -> object:
    """A decoded ImageItem of random pixels (core's own Pillow decoder)."""
    width, height = size
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return decode(MediaBlob.of(out.getvalue(), "image/png", "data"), MediaLimits())


@pytest.fixture(scope="module", params=MORE_SHAPES)
def case(request, vlm_checkpoint):
    """The shape's decoder, its chat-template prompt (text and ids, as core tokenizes a
    rendered prompt: no special tokens added) and two images of unlike sizes."""
    model = decoder(load(vlm_checkpoint(request.param), LoadOptions()))
    tok = model.processor.tokenizer
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = list(tok.encode(text, add_special_tokens=False))
    items = [item(seed, size) for seed, size in zip((1, 2), SIZES, strict=True)]
    return request.param, model, text, ids, items


def theirs(model, text, items):
    """The processor's own inputs for the prompt text, less the tokens its tokenizer adds
    to any text (LLaVA's and Mistral's BOS: the template printed Mistral's own)."""
    out = dict(model.processor(text=[text], images=[i.image for i in items]))
    ids = [int(t) for t in np.asarray(out.pop("input_ids")).reshape(-1)]
    before, _ = media._added(model.processor.tokenizer)
    out.pop("attention_mask", None)
    return ids[len(before):], out


def test_the_rule_is_text(case):
    _, model, *_ = case
    assert media.rule(model.processor) == "text"
    assert model.media_placeholder("image") == model.processor.image_token


def test_ids_are_the_processors_own(case):
    _, model, text, ids, items = case
    prompt = model.expand_media(ids, items, {})
    assert list(prompt.token_ids) == theirs(model, text, items)[0]
    assert prompt.inputs["rule"] == "text"
    assert "input_ids" not in prompt.inputs and "attention_mask" not in prompt.inputs


def test_each_image_has_its_own_span_and_growth(case):
    """Each image's span runs from its first image token to its last and holds as many as
    the processor gives that image alone; the spans hold every image token of the
    prompt; each growth sits at its own placeholder and is its own run's."""
    shape, model, _, ids, items = case
    proc = model.processor
    image_id = proc.image_token_id
    prompt = model.expand_media(ids, items, {})
    out = prompt.token_ids
    alone = [theirs(model, proc.image_token, [i])[0] for i in items]
    placeholders = [p for p, t in enumerate(ids) if t == image_id]
    assert [at for at, _ in prompt.grown] == placeholders
    assert [added for _, added in prompt.grown] == [len(one) - 1 for one in alone]
    covered = []
    for (start, length), one in zip(prompt.spans, alone, strict=True):
        assert out[start] == out[start + length - 1] == image_id
        span = out[start:start + length]
        assert span.count(image_id) == one.count(image_id)
        covered.extend(range(start, start + length))
    assert [p for p, t in enumerate(out) if t == image_id] == \
        [p for p in covered if out[p] == image_id]
    if shape != "llava_1_5":  # LLaVA crops every image to one square: equal runs
        assert prompt.grown[0][1] != prompt.grown[1][1]


def test_marks_after_the_images_move_with_the_growth(case):
    """Core moves the positions it found in the unexpanded ids (cache marks) by the
    growth before them: a mark on the last token lands on the last token."""
    _, model, _, ids, items = case
    prompt, moved = chat_expand(model, ids, items, {}, ((len(ids) - 1, "end"),))
    assert moved == ((len(prompt.token_ids) - 1, "end"),)
    assert prompt.token_ids[-1] == ids[-1]


def test_embeddings_are_mlx_vlms_own(case):
    """The row's input embeddings equal mlx-vlm's ``get_input_embeddings`` over the
    processor's own outputs for the prompt text."""
    _, model, text, ids, items = case
    prompt = model.expand_media(ids, items, {})
    ours = model.media_embeddings(prompt, FeatureCache(4))
    full = dict(model.processor(text=[text], images=[i.image for i in items]))
    skip = len(full["input_ids"][0]) - len(prompt.token_ids)  # the tokenizer's BOS
    ids_theirs = mx.array(np.asarray(full.pop("input_ids")))
    full.pop("attention_mask", None)
    arrays = {k: mx.array(np.asarray(v)) for k, v in full.items()}
    pixels = arrays.pop("pixel_values")
    want = model.model.get_input_embeddings(ids_theirs, pixels, mask=mx.ones(ids_theirs.shape),
                                            **arrays).inputs_embeds[:, skip:]
    assert ours.shape == want.shape == (1, len(prompt.token_ids), ours.shape[-1])
    assert mx.allclose(ours, want, atol=1e-5).item()


def test_a_placeholder_count_unlike_the_items_is_refused(case):
    _, model, _, ids, items = case
    with pytest.raises(InvalidRequest, match="2 image"):
        model.expand_media(ids, items[:1], {})
    with pytest.raises(InvalidRequest, match="2 image"):
        model.expand_media(ids, [*items, items[0]], {})


def test_an_image_row_decodes_as_mlx_vlm_does(case, vlm_checkpoint):
    shape, model, _, ids, items = case
    prompt = model.expand_media(ids, items, {})
    engine = engine_for(vlm_checkpoint(shape), parallel=2, chunk=16)
    try:
        (tokens, _), = run(engine, [media_request(prompt, max_tokens=8)])
    finally:
        engine.shutdown()
    assert tokens == mlx_vlm_greedy(model.model, prompt, 8)
