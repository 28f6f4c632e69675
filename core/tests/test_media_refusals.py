"""A decoder's refusal of an item (``chat.media.expand``): a 400 naming the part the
decoder named (``MediaRefused``), the only part, or the prompt as a whole; never a 500.
The model here is a stand-in for a family's decoder: what is tested is core's mapping."""

from __future__ import annotations

import pytest
from mlxcel.chat.media import expand
from mlxcel.errors import InvalidRequest
from mlxcel.families.media import MediaRefused
from mlxcel.media.api import ImageItem
from mlxcel.types.media import MediaPrompt

PARTS = ("messages[0].content[0]", "messages[2].content[1]")


class Refusing:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def expand_media(self, ids, items, options):
        if self.error is not None:
            raise self.error
        return MediaPrompt(token_ids=tuple(ids), spans=(), digests=(), grown=(), inputs={})


def item(n: int) -> ImageItem:
    return ImageItem(image=None, width=1, height=1, digest=bytes([n]))


@pytest.mark.parametrize("error, count, param", [
    (MediaRefused(1, "aspect ratio 300"), 2, PARTS[1]),
    (MediaRefused(0, "aspect ratio 300"), 2, PARTS[0]),
    (ValueError("aspect ratio 300"), 1, PARTS[0]),
    (ValueError("aspect ratio 300"), 2, "messages"),
])
def test_a_refused_item_is_a_400_naming_its_part(error, count, param):
    with pytest.raises(InvalidRequest) as caught:
        expand(Refusing(error), [1, 2], [item(i) for i in range(count)], {}, (),
               PARTS[:count])
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.message.startswith(f"{param}: the model's processor cannot take")
    assert "aspect ratio 300" in caught.value.message


def test_the_prompts_own_name_stands_where_no_part_is_named():
    with pytest.raises(InvalidRequest) as caught:
        expand(Refusing(ValueError("no")), [1], [item(0), item(1)], {}, (), PARTS, "prompt")
    assert caught.value.param == "prompt"


def test_other_errors_are_not_taken_for_a_refusal():
    with pytest.raises(KeyError):
        expand(Refusing(KeyError("bug")), [1], [item(0)], {}, (), PARTS[:1])
    prompt, marks = expand(Refusing(None), [1, 2], [item(0)], {}, ((1, "end"),), PARTS[:1])
    assert prompt.token_ids == (1, 2) and marks == ((1, "end"),)


class Odd:
    """A decoder that fails on images whose sides are over 100 times apart."""

    def __init__(self, error: type[Exception], index: int = 0) -> None:
        self.error, self.index = error, index

    def expand_media(self, ids, items, options):
        w, h = items[0].width, items[0].height
        if max(w, h) > 100 * min(w, h):
            if self.error is MediaRefused:
                raise MediaRefused(self.index, "too thin")
            raise self.error("too thin")
        return MediaPrompt(token_ids=tuple(ids), spans=(), digests=(), grown=(), inputs={})


@pytest.mark.parametrize("decoder, passes", [
    (Odd(MediaRefused), True), (Odd(ValueError), True), (Odd(ZeroDivisionError), False),
    (Odd(MediaRefused, index=3), False)])
def test_the_conformance_kit_holds_decoders_to_the_refusal_rule(decoder, passes):
    from mlxcel.testing.conformance import _odd_images_expand_or_are_refused

    if passes:
        _odd_images_expand_or_are_refused(decoder, [1, 2], 1)
    else:
        with pytest.raises(AssertionError):
            _odd_images_expand_or_are_refused(decoder, [1, 2], 1)
