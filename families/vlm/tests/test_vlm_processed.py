"""The processor's arrays of recent images (``mlxcel_family_vlm.processed``): joined from
each image's own, they equal the processor's for the images together; a repeated image
is not processed again; the cache stays within its size."""

from __future__ import annotations

import numpy as np
import pytest
from mlxcel.families.api import LoadOptions
from mlxcel.families.media import MediaRefused
from mlxcel.testing.vlm_reference import noise_item
from mlxcel_family_vlm import media
from mlxcel_family_vlm.load import decoder, load
from mlxcel_family_vlm.processed import ProcessedImages


class Counting:
    """The model's processor, counting the images its image processor is given."""

    def __init__(self, processor) -> None:
        self.processor = processor
        self.seen = 0

    def __getattr__(self, name):
        return getattr(self.processor, name)

    @property
    def image_processor(self):
        outer = self

        class Images:
            def __getattr__(self, name):
                return getattr(outer.processor.image_processor, name)

            def __call__(self, images, **kwargs):
                outer.seen += len(images)
                return outer.processor.image_processor(images=images, **kwargs)

        return Images()


@pytest.fixture(scope="module", params=["qwen2_vl", "gemma3"])
def model(request, vlm_checkpoint):
    return decoder(load(vlm_checkpoint(request.param), LoadOptions()))


def test_joined_arrays_equal_the_processors_for_the_images_together(model):
    items = [noise_item(1), noise_item(2, 84, 56), noise_item(3, 56, 112)]
    whole = model.processor.image_processor(images=[i.image for i in items],
                                            return_tensors="np")
    cache = ProcessedImages()
    for _ in range(2):  # processed, then joined from the cache
        joined = cache.arrays(model.processor, [i.image for i in items],
                              tuple(i.digest for i in items))
        assert joined.keys() == {k for k, v in dict(whole).items() if v is not None}
        for key, value in joined.items():
            np.testing.assert_array_equal(value, np.asarray(whole[key]), err_msg=key)
    assert (cache.kept.misses, cache.kept.hits) == (3, 3)


def test_a_repeated_image_is_not_processed_again(model):
    counting = Counting(model.processor)
    cache = ProcessedImages()
    first, second = noise_item(4), noise_item(5)
    if media.rule(model.processor) == "grid":
        ids = list(model.processor.tokenizer.encode(
            "<|vision_start|><|image_pad|><|vision_end|>hi", add_special_tokens=False))
    else:
        ids = list(model.processor.tokenizer.encode(f"{model.processor.boi_token}hi",
                                                    add_special_tokens=False))
    plain = media.expand(model.processor, ids, [first.image], (first.digest,))
    once = media.expand(counting, ids, [first.image], (first.digest,), cache)
    again = media.expand(counting, ids, [first.image], (first.digest,), cache)
    assert counting.seen == 1
    assert once.token_ids == again.token_ids == plain.token_ids
    for key, value in plain.inputs.items():
        if key != "rule":
            np.testing.assert_array_equal(again.inputs[key], value, err_msg=key)
    media.expand(counting, ids, [second.image], (second.digest,), cache)
    assert counting.seen == 2


def test_the_cache_keeps_its_size_and_its_arrays_are_read_only(model):
    cache = ProcessedImages(size=2)
    items = [noise_item(s) for s in (6, 7, 8)]
    for item in items:
        arrays = cache.arrays(model.processor, [item.image], (item.digest,))
    assert len(cache.kept) == 2
    assert all(not v.flags.writeable for v in arrays.values())
    cache.arrays(model.processor, [items[0].image], (items[0].digest,))  # evicted: again
    assert cache.kept.misses == 4
    none = ProcessedImages(size=0)
    none.arrays(model.processor, [items[0].image], (items[0].digest,))
    assert len(none.kept) == 0


def test_the_family_model_keeps_its_images(vlm_checkpoint):
    model = decoder(load(vlm_checkpoint("qwen2_vl"), LoadOptions()))
    ids = list(model.processor.tokenizer.encode(
        "<|vision_start|><|image_pad|><|vision_end|>hi", add_special_tokens=False))
    item = noise_item(9)
    model.expand_media(ids, [item], {})
    model.expand_media(ids, [item], {})
    assert (model.processed.kept.misses, model.processed.kept.hits) == (1, 1)


def test_an_image_the_processor_refuses_is_named_by_its_index(vlm_checkpoint):
    qwen = decoder(load(vlm_checkpoint("qwen2_vl"), LoadOptions()))
    ids = [qwen.processor.image_token_id] * 2
    items = [noise_item(1), noise_item(2, 3000, 10)]  # Qwen-VL refuses sides 200 times apart
    with pytest.raises(MediaRefused) as caught:
        qwen.expand_media(ids, items, {})
    assert caught.value.index == 1 and "aspect ratio" in caught.value.reason
    assert len(qwen.expand_media(ids[:1], items[:1], {}).spans) == 1
