"""Images decoded lately (``mlxcel.media.recent``, ``decode_media(recent=)``): the same
bytes give the kept item without decoding again, every check on the bytes still runs
first, refusals are never kept, and the memo holds its count and byte bounds."""

from __future__ import annotations

import io

import pytest
from mlxcel.builtin import media as builtin_media
from mlxcel.errors import InvalidRequest
from mlxcel.media import image as core_image
from mlxcel.media.api import MediaLimits
from mlxcel.media.decode import decode_media, recent_images
from mlxcel.media.recent import Recent
from mlxcel.media.registry import MediaDecoderRegistry
from mlxcel.types.media import MediaBlob
from PIL import Image

PART = "messages[0].content[1]"


def registry() -> MediaDecoderRegistry:
    out = MediaDecoderRegistry()
    out.current_owner = "media-builtin"
    builtin_media.mlxcel_register_media_decoders(registry=out)
    return out


def png(color=(10, 20, 30), size=(32, 16)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def decodes(monkeypatch):
    """Counts the core decoder's calls."""
    calls = []
    real = core_image.decode
    monkeypatch.setattr(core_image, "decode", lambda blob, limits: calls.append(1) or real(
        blob, limits))
    return calls


def test_the_same_bytes_are_decoded_once(decodes):
    recent, reg = recent_images(), registry()
    first = decode_media(MediaBlob.of(png(), "image/png", "data"), "image", reg,
                         MediaLimits(), PART, recent)
    again = decode_media(MediaBlob.of(png(), "", "data"), "image", reg, MediaLimits(), "p",
                         recent)
    assert again is first and len(decodes) == 1
    other = decode_media(MediaBlob.of(png((1, 2, 3)), "", "data"), "image", reg,
                         MediaLimits(), PART, recent)
    assert other.digest != first.digest and len(decodes) == 2
    decode_media(MediaBlob.of(png(), "", "data"), "image", reg, MediaLimits(), PART)
    assert len(decodes) == 3  # no memo given: decoded


def test_a_kept_image_is_still_checked_against_its_declared_type(decodes):
    recent, reg = recent_images(), registry()
    decode_media(MediaBlob.of(png(), "image/png", "data"), "image", reg, MediaLimits(), PART,
                 recent)
    with pytest.raises(InvalidRequest, match="JPEG|jpeg"):
        decode_media(MediaBlob.of(png(), "image/jpeg", "data"), "image", reg, MediaLimits(),
                     PART, recent)


def test_other_limits_decode_again_and_refusals_are_not_kept(decodes):
    recent, reg = recent_images(), registry()
    small = MediaLimits(max_width=8)
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            decode_media(MediaBlob.of(png(), "", "data"), "image", reg, small, PART, recent)
    assert len(recent) == 0 and len(decodes) == 2
    decode_media(MediaBlob.of(png(), "", "data"), "image", reg, MediaLimits(), PART, recent)
    assert len(recent) == 1


def test_the_memo_keeps_its_count_and_bytes():
    made = []
    memo: Recent[bytes] = Recent(3, 100, len)
    for key in "abcd":
        memo.get(key, lambda key=key: made.append(key) or key.encode() * 10)
    assert len(memo) == 3 and memo.bytes == 30
    memo.get("a", lambda: made.append("a") or b"a" * 10)  # evicted first: made again
    assert made == ["a", "b", "c", "d", "a"]
    memo.get("c", lambda: b"")  # kept: a hit
    assert memo.hits == 1
    memo.get("big", lambda: b"x" * 26)  # over a quarter of the budget: not kept
    assert "big" not in [k for k in memo._items]
    memo.get("e", lambda: b"e" * 25)
    memo.get("f", lambda: b"f" * 25)
    assert memo.bytes <= 100 and len(memo) <= 3
    memo.clear()
    assert len(memo) == 0 and memo.bytes == 0
