"""Gemma 4 vision on the tiny random-weight ``gemma4`` checkpoint (a real processor config:
8 px patches pooled 2x2, a budget of 10 soft tokens, so a 56x56 image is 9 tokens):
the expansion and its budgets, embeddings and greedy tokens against mlx-vlm's own, image
rows in the continuous batch beside text rows, both caches, the chat API, and the text
path kept where mlx-vlm is missing."""

from __future__ import annotations

import base64
import io

import mlx.core as mx
import numpy as np
import pytest

pytest.importorskip("mlx_vlm")
pytest.importorskip("mlxcel_family_vlm")

from mlxcel.engine.media_rows import FeatureCache  # noqa: E402
from mlxcel.errors import InvalidRequest  # noqa: E402
from mlxcel.families.api import LoadOptions  # noqa: E402
from mlxcel.media.api import MediaLimits  # noqa: E402
from mlxcel.media.image import decode as decode_image  # noqa: E402
from mlxcel.testing.engine import (  # noqa: E402
    app_client,
    cpu_policy,
    engine_for,
    media_request,
    request,
    run,
)
from mlxcel.testing.vlm_reference import (  # noqa: E402
    feed_rows,
    mlx_vlm_greedy,
    one_at_a_time,
    rows_beside_text,
)
from mlxcel.types.media import MediaBlob  # noqa: E402
from mlxcel_family_gemma4.load import decoder, load  # noqa: E402
from PIL import Image  # noqa: E402

CHAT = "/v1/chat/completions"
TURN = "<|turn>user\n{}<turn|>\n<|turn>model\n"
TAIL = " Describe the picture in a few plain words, please, and then say why."
TOKENS_56 = 9  # a 56x56 image: resized to 48x48, 6x6 patches pooled 2x2
TOKENS_56_AT_70 = 64  # under a budget of 70: resized to 128x128, 16x16 patches pooled


def png(seed: int, width: int = 56, height: int = 56) -> bytes:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def image(seed: int, width: int = 56, height: int = 56):
    """A decoded ImageItem (core's own Pillow decoder)."""
    return decode_image(MediaBlob.of(png(seed, width, height), "image/png", "data"),
                        MediaLimits())


@pytest.fixture(scope="module")
def path(mlxcel_checkpoint_cache):
    from mlxcel.testing.vlm_checkpoints import cached_vlm_checkpoint

    return cached_vlm_checkpoint("gemma4", cache_dir=mlxcel_checkpoint_cache)


@pytest.fixture(scope="module")
def model(path):
    return decoder(load(path, LoadOptions()))


def encode(model, text: str) -> list[int]:
    return list(model.processor.tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def ids(model):
    return encode(model, TURN.format("<|image|>" + TAIL))


def test_a_checkpoint_with_a_tower_loads_through_mlx_vlm(model):
    from mlx_lm.models.cache import KVCache, RotatingKVCache
    from mlxcel.families.media import media_kinds

    assert type(model).__name__ == "Gemma4Vision" and media_kinds(model) == ("image",)
    assert model.media_placeholder("image") == "<|image|>"
    # mlx-lm's own cache classes, which the engine batches, extracts and stores
    assert {type(c) for c in model.make_cache()} == {KVCache, RotatingKVCache}


def test_the_placeholder_becomes_the_images_sequence(model, ids):
    item = image(1)
    prompt = model.expand_media(ids, [item], {})
    (start, length), = prompt.spans
    assert length == TOKENS_56
    out = prompt.token_ids
    assert out[start - 1] == model.boi_id and out[start + length] == model.eoi_id
    assert out[start:start + length] == (model.image_id,) * length
    assert prompt.grown == ((ids.index(model.image_id), length + 1),)
    assert prompt.digest_positions() == ((start, item.digest),)


def test_images_of_other_shapes_get_their_own_counts(model):
    ids = encode(model, TURN.format("<|image|> and <|image|>" + TAIL))
    prompt = model.expand_media(ids, [image(2), image(3, 96, 32)], {})
    lengths = [n for _, n in prompt.spans]
    shapes = [p.shape for p in prompt.inputs["pixel_values"]]
    # 96x32 under 10 tokens: 80x16 px, 10x2 patches pooled 2x2
    assert lengths == [TOKENS_56, 5] and shapes == [(3, 48, 48), (3, 16, 80)]


def test_max_soft_tokens_sets_the_budget_and_keys_the_digest(model, ids):
    item = image(4)
    default = model.expand_media(ids, [item], {})
    wide = model.expand_media(ids, [item], {"max_soft_tokens": 70})
    assert wide.spans[0][1] == TOKENS_56_AT_70 != default.spans[0][1]
    assert wide.digests != default.digests and default.digests == (item.digest,)
    # the checkpoint's own budget is the default's: same tokens, same digest
    same = model.expand_media(ids, [item], {"max_soft_tokens": 10})
    assert same.token_ids == default.token_ids and same.digests == default.digests
    with pytest.raises(InvalidRequest, match="max_soft_tokens 71"):
        model.expand_media(ids, [item], {"max_soft_tokens": 71})


def test_a_placeholder_count_unlike_the_items_is_refused(model, ids):
    with pytest.raises(InvalidRequest, match="2 image"):
        model.expand_media(ids, [image(1), image(2)], {})


def test_embeddings_are_mlx_vlms_own_and_features_are_cached(model):
    """Each image encoded alone through the feature cache gives the embeddings mlx-vlm's
    processor and model compute for the prompt's images together; the second time they
    come from the cache, and another budget is another entry."""
    ids = encode(model, TURN.format("a <|image|> b <|image|>" + TAIL))
    items = [image(5), image(6, 80, 40)]
    prompt = model.expand_media(ids, items, {})
    text = model.processor.tokenizer.decode(ids, skip_special_tokens=False)
    theirs = model.processor(text=[text], images=[i.image for i in items])
    their_ids = [int(t) for t in np.array(theirs["input_ids"][0])]
    assert their_ids[1:] == list(prompt.token_ids)  # the processor adds <bos>
    want = model.model.get_input_embeddings(
        theirs["input_ids"], pixel_values=theirs["pixel_values"]).inputs_embeds[:, 1:]
    features = FeatureCache(8)
    ours = model.media_embeddings(prompt, features)
    assert ours.shape == want.shape and mx.allclose(ours, want, atol=1e-5).item()
    assert (features.misses, features.hits) == (2, 0)
    model.media_embeddings(prompt, features)
    assert (features.misses, features.hits) == (2, 2)
    model.media_embeddings(model.expand_media(ids, items, {"max_soft_tokens": 70}), features)
    assert (features.misses, features.hits) == (4, 2)


def test_the_media_contract_conforms(path, model):
    from mlxcel.testing.conformance import check_media_model

    ids = encode(model, TURN.format("<|image|>" + TAIL + TAIL))
    check_media_model(path, [image(7)], ids)


def _mlx_vlm_greedy(model, prompt, n: int, vision_blocks: bool = False) -> list[int]:
    """mlx-vlm's own loop on the expanded prompt, its pixels one array per image;
    ``vision_blocks``: with the processor's ``mm_token_type_ids`` (image tokens 1), as
    mlx-vlm's generate passes them."""
    pixels = [mx.array(p)[None] for p in prompt.inputs["pixel_values"]]
    ids = mx.array(prompt.token_ids)[None]
    extra = {"mm_token_type_ids": (ids == model.image_id).astype(mx.int32)} \
        if vision_blocks else {}
    return mlx_vlm_greedy(model.model, prompt, n, pixels=pixels, **extra)


def test_image_rows_batched_equal_solo_and_mlx_vlms_own(path, model, ids):
    """Greedy tokens of image rows decoded beside text rows (and beside each other) equal
    each row alone and, for the image rows, mlx-vlm's own generate loop."""
    prompts = [model.expand_media(ids, [image(seed)], {}) for seed in (8, 9)]
    text = [ids[:-3] + [40 + i, 41, 42] for i in range(3)]
    together, alone = rows_beside_text(path, prompts, text)
    assert together == alone
    for prompt, tokens in zip(prompts, alone, strict=False):
        assert tokens == _mlx_vlm_greedy(model, prompt, 10)


@pytest.fixture(scope="module")
def bidirectional(path, tmp_path_factory):
    """The checkpoint with the real Gemma 4's text config key: image tokens attend to
    their whole image (``use_bidirectional_attention: "vision"``)."""
    import json
    import shutil

    out = tmp_path_factory.mktemp("gemma4") / "bidirectional"
    shutil.copytree(path, out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    config["text_config"]["use_bidirectional_attention"] = "vision"
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def test_image_tokens_attend_to_their_whole_image(bidirectional, ids):
    """With the vision overlay, an image row beside text rows gives mlx-vlm's own tokens
    with its ``mm_token_type_ids``, which differ from a causal image block's."""
    model = decoder(load(bidirectional, LoadOptions()))
    assert model.bidirectional
    prompt = model.expand_media(ids, [image(8)], {})
    row = media_request(prompt, max_tokens=10)
    text = [request(ids[:-3] + [40 + i, 41, 42], max_tokens=10) for i in range(2)]
    engine = engine_for(bidirectional, parallel=3, chunk=64)
    try:
        together = [tokens for tokens, _ in run(engine, [text[0], row, text[1]])]
    finally:
        engine.shutdown()
    theirs = _mlx_vlm_greedy(model, prompt, 10, vision_blocks=True)
    assert together[1] == theirs != _mlx_vlm_greedy(model, prompt, 10)


def test_image_rows_prefilled_together_attend_to_their_whole_image(bidirectional, ids,
                                                                   monkeypatch):
    """Two image rows of unequal length in one padded group, over several chunks, each
    give mlx-vlm's own tokens with its ``mm_token_type_ids``."""
    rows = feed_rows(monkeypatch)
    model = decoder(load(bidirectional, LoadOptions()))
    prompts = [model.expand_media(ids, [image(8)], {}),
               model.expand_media(ids[:-3] + [40, 41, 42, 43, 44] + ids[-3:], [image(9)], {})]
    engine = engine_for(bidirectional, parallel=3, chunk=16,
                        policy=cpu_policy(burst_chunks=8))
    try:
        together = [tokens for tokens, _ in run(engine, [media_request(p, max_tokens=10)
                                                          for p in prompts])]
    finally:
        engine.shutdown()
    assert max(rows) == 2, "the image rows did not prefill in one group"
    for prompt, tokens in zip(prompts, together, strict=True):
        assert tokens == _mlx_vlm_greedy(model, prompt, 10, vision_blocks=True)


def test_a_repeated_image_hits_both_caches_and_another_misses(path, model, ids):
    """The same prompt again reuses the prompt cache past its image (the vision tower does
    not run); the same image after other text reuses its features; another image, or the
    same one under another budget, shares neither."""
    first, other = (model.expand_media(ids, [image(s)], {}) for s in (10, 11))
    wide = model.expand_media(ids, [image(10)], {"max_soft_tokens": 70})
    moved = model.expand_media(encode(model, TURN.format("Look: <|image|>" + TAIL)),
                               [image(10)], {})
    asked = one_at_a_time(path, [first, first, other, wide, moved])
    (tokens, _, _), (again, last_again, _), (_, last_other, _) = asked[:3]
    (_, last_wide, features), (_, _, features_moved) = asked[3:]
    assert features == (3, 0) and features_moved == (3, 1)
    start, length = first.spans[0]
    assert again == tokens
    assert last_again.usage.cached_tokens > start + length
    assert last_other.usage.cached_tokens <= start
    assert last_wide.usage.cached_tokens <= start


def _image_part(seed: int) -> dict:
    return {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(png(seed)).decode()}}


@pytest.fixture(scope="module")
def client(path):
    with app_client(path, parallel=4) as c:
        yield c


def _chat(client, content, **extra):
    return client.post(CHAT, json={"messages": [{"role": "user", "content": content}],
                                   "max_tokens": 4, "temperature": 0, **extra})


def test_an_image_chat_request_counts_the_images_tokens(client):
    text = {"type": "text", "text": "What is it?"}
    plain = _chat(client, [text])
    with_image = _chat(client, [_image_part(12), text])
    assert plain.status_code == 200 and with_image.status_code == 200, with_image.text
    grown = (with_image.json()["usage"]["prompt_tokens"]
             - plain.json()["usage"]["prompt_tokens"])
    # the image part's <|image|> became <|image>, the image's soft tokens, <image|>
    assert grown == TOKENS_56 + 2


def test_max_soft_tokens_on_the_wire_sets_the_budget(client):
    text = {"type": "text", "text": "What is it?"}
    plain = _chat(client, [text])
    wide = _chat(client, [_image_part(12), text], max_soft_tokens=70)
    assert wide.status_code == 200, wide.text
    assert wide.json()["usage"]["prompt_tokens"] - plain.json()["usage"]["prompt_tokens"] \
        == TOKENS_56_AT_70 + 2
    refused = _chat(client, [_image_part(12), text], max_soft_tokens=71)
    assert refused.status_code == 400 and "max_soft_tokens" in refused.text


def test_a_repeated_image_request_reuses_the_prompt_cache(client):
    """Timing-free: the second request's cached tokens reach past the image."""
    text = {"type": "text", "text": TAIL}
    first = _chat(client, [_image_part(13), text])
    again = _chat(client, [_image_part(13), text])
    other = _chat(client, [_image_part(14), text])
    assert first.status_code == again.status_code == other.status_code == 200
    cached = again.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    other_cached = other.json()["usage"].get("prompt_tokens_details", {}).get(
        "cached_tokens", 0)
    assert cached > TOKENS_56 + 4 and other_cached < cached


def test_without_mlx_vlm_a_tower_checkpoint_serves_text(path, monkeypatch):
    """The extra missing: mlx-lm's Gemma 4 loads the text model, and a log line names
    the extra that adds image input."""
    from mlxcel.families.media import media_kinds
    from mlxcel_family_gemma4 import load as loader
    from structlog.testing import capture_logs

    monkeypatch.setattr(loader, "vision_available", lambda: False)
    with capture_logs() as logs:
        model = loader.decoder(loader.load(path, LoadOptions()))
    assert type(model.model).__module__.startswith("mlx_lm.models.")
    assert media_kinds(model) == ()
    hints = [e for e in logs if e.get("event") == "family_hint"]
    assert hints and "mlxcel-family-gemma4[vision]" in hints[0]["adds"]


def test_a_text_checkpoint_still_loads_through_mlx_lm(gemma4_checkpoint):
    from mlxcel.families.media import media_kinds

    model = decoder(load(gemma4_checkpoint, LoadOptions()))
    assert type(model.model).__module__.startswith("mlx_lm.models.")
    assert media_kinds(model) == ()


def test_the_engine_warm_up_plays_an_image_row_on_the_mixed_path(path):
    """``accel.warmup.media_lifecycle`` on Gemma 4's sliding-window caches: the tower and
    an image row's prefill and decode steps run once, before any client's image."""
    from mlxcel.engine import mixed_batch
    from mlxcel.engine.accel.warmup import media_lifecycle, media_prompt
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    checkpoint = load_checkpoint(str(path), load_plugins().families)
    lane, merge, _ = mixed_batch.cache_path(checkpoint.model, checkpoint.family)
    assert lane == "mixed"
    prompt = media_prompt(checkpoint.model, checkpoint.tokenizer)
    calls = []
    embeddings = checkpoint.model.media_embeddings
    checkpoint.model.media_embeddings = lambda *a: calls.append(1) or embeddings(*a)
    media_lifecycle(checkpoint.model, None, checkpoint.tokenizer.vocab_size, prompt,
                    merge=merge)
    assert calls == [1]
