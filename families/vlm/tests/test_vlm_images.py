"""Image rows: the family's expansion of a prompt's placeholders, its input embeddings
against mlx-vlm's own, and image rows in the engine (batched = solo = mlx-vlm's own
generate loop; the vision-feature cache and the prompt cache)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.engine.media_rows import FeatureCache
from mlxcel.errors import InvalidRequest
from mlxcel.families.api import LoadOptions
from mlxcel.testing.vlm_reference import mlx_vlm_greedy, noise_item, one_at_a_time, rows_beside_text
from mlxcel_family_vlm.load import decoder, load

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?" \
         "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen(vlm_checkpoint):
    path = vlm_checkpoint("qwen2_vl")
    model = decoder(load(path, LoadOptions()))
    tok = model.processor.tokenizer
    return path, model, list(tok.encode(PROMPT, add_special_tokens=False))


def test_the_placeholder_becomes_the_images_tokens(qwen):
    _, model, ids = qwen
    item = noise_item(1)
    prompt = model.expand_media(ids, [item], {})
    grid = prompt.inputs["image_grid_thw"].reshape(-1)
    count = int(np.prod(grid)) // model.processor.image_processor.merge_size ** 2
    token = model.processor.image_token_id
    (start, length), = prompt.spans
    assert length == count and prompt.token_ids[start:start + length] == (token,) * count
    assert len(prompt.token_ids) == len(ids) + count - 1
    assert prompt.grown == ((ids.index(token), count - 1),)
    assert prompt.digest_positions() == ((start, item.digest),)


def test_a_placeholder_count_unlike_the_items_is_refused(qwen):
    _, model, ids = qwen
    with pytest.raises(InvalidRequest, match="2 image"):
        model.expand_media(ids, [noise_item(1), noise_item(2)], {})


def test_gemma3_placeholder_becomes_its_image_sequence(vlm_checkpoint):
    model = decoder(load(vlm_checkpoint("gemma3"), LoadOptions()))
    proc = model.processor
    tok = proc.tokenizer
    ids = list(tok.encode(f"<start_of_turn>user\n{proc.boi_token}Describe<end_of_turn>\n",
                          add_special_tokens=False))
    prompt = model.expand_media(ids, [noise_item(3)], {})
    (start, length), = prompt.spans
    assert length == proc.image_seq_length
    soft = tok.convert_tokens_to_ids(proc.image_token)
    assert set(prompt.token_ids[start:start + length]) == {soft}
    assert soft not in prompt.token_ids[:start] + prompt.token_ids[start + length:]


@pytest.mark.parametrize("shape", ["qwen2_vl", "gemma3"])
def test_cached_features_give_mlx_vlms_own_embeddings(vlm_checkpoint, shape):
    """Each image encoded alone through the feature cache gives the embeddings mlx-vlm
    computes for the prompt's images together, and the second time comes from the cache."""
    model = decoder(load(vlm_checkpoint(shape), LoadOptions()))
    proc = model.processor
    mark = proc.boi_token if shape == "gemma3" else "<|image_pad|>"
    ids = list(proc.tokenizer.encode(f"a {mark} b {mark} c", add_special_tokens=False))
    prompt = model.expand_media(ids, [noise_item(4), noise_item(5)], {})
    features = FeatureCache(4)
    ours = model.media_embeddings(prompt, features)
    arrays = {k: mx.array(v) for k, v in prompt.inputs.items() if k != "rule"}
    pixels = arrays.pop("pixel_values")
    ids = mx.array(prompt.token_ids)[None]
    theirs = model.model.get_input_embeddings(ids, pixels, mask=mx.ones(ids.shape),
                                              **arrays).inputs_embeds
    assert ours.shape == theirs.shape
    assert mx.allclose(ours, theirs, atol=1e-4).item()
    assert (features.misses, features.hits) == (2, 0)
    model.media_embeddings(prompt, features)
    assert (features.misses, features.hits) == (2, 2)


def test_image_rows_batched_equal_solo_and_mlx_vlms_own(qwen):
    """Greedy tokens of image rows decoded beside text rows (and beside each other) equal
    each row alone and, for the image rows, mlx-vlm's own generate loop: the rows' M-RoPE
    shifts stay with them in the batch."""
    path, model, ids = qwen
    prompts = [model.expand_media(ids, [noise_item(seed)], {}) for seed in (6, 7)]
    text = [ids[:-3] + [40 + i, 41, 42] for i in range(3)]
    together, alone = rows_beside_text(path, prompts, text)
    assert together == alone
    for prompt, tokens in zip(prompts, alone, strict=False):
        assert tokens == mlx_vlm_greedy(model.model, prompt, 10)


def test_a_repeated_image_hits_both_caches_and_another_misses(qwen):
    """The same prompt again reuses the prompt cache past its image: the tail is text, fed
    as ids, so neither the tower nor the feature cache is asked. The same image after other
    text misses the prompt cache before the image and takes its features from the feature
    cache; another image misses both."""
    path, model, ids = qwen
    first, other = (model.expand_media(ids, [noise_item(s)], {}) for s in (8, 9))
    moved = model.expand_media(ids[:1] + [ids[1] + 1] + ids[1:], [noise_item(8)], {})
    (tokens, _, counts), (again, last_again, counts_again), (_, last_moved, counts_moved), \
        (_, last_other, counts_other) = one_at_a_time(path, [first, first, moved, other])
    start = first.spans[0][0]
    assert again == tokens
    assert last_again.usage.cached_tokens > start + first.spans[0][1]
    assert counts == counts_again == (1, 0)  # (misses, hits): the repeat asked nothing
    assert last_moved.usage.cached_tokens <= start and counts_moved == (1, 1)
    assert last_other.usage.cached_tokens <= start and counts_other == (2, 1)
