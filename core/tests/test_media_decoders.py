"""Media decoder contract v2: core's Pillow decoder, the registry's choice by the bytes, the
limits and refusals of ``decode_media``, and ``check_media_decoder``.

Every image is made here with Pillow, in memory; the decompression bombs are headers
written by hand (a few hundred bytes that declare a huge image)."""

from __future__ import annotations

import io
import struct
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from mlxcel.builtin import media as builtin_media
from mlxcel.errors import InvalidRequest, MlxcelError, PluginError
from mlxcel.media.api import ImageItem, MediaDecoder, MediaLimits, check_image_size
from mlxcel.media.decode import check_image_count, decode_media
from mlxcel.media.registry import MediaDecoderRegistry
from mlxcel.testing.conformance import check_media_decoder
from mlxcel.types.media import MediaBlob
from PIL import Image, ImageFile

PART = "messages[0].content[1]"
RED, BLUE = (255, 0, 0), (0, 0, 255)


def _registry(*extra: MediaDecoder, owner: str = "unit-extra") -> MediaDecoderRegistry:
    registry = MediaDecoderRegistry()
    registry.current_owner = "media-builtin"
    builtin_media.mlxcel_register_media_decoders(registry=registry)
    registry.current_owner = owner
    for decoder in extra:
        registry.add(decoder)
    return registry


def _decode(data: bytes, mime: str = "", limits: MediaLimits | None = None,
            registry: MediaDecoderRegistry | None = None) -> ImageItem:
    return decode_media(MediaBlob.of(data, mime, "data"), "image", registry or _registry(),
                        limits or MediaLimits(), PART)


def _refused(data: bytes, mime: str = "", **kw) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        _decode(data, mime, **kw)
    assert err.value.status == 400 and err.value.param == PART
    assert err.value.message.startswith(f"{PART}: ")
    return err.value


def _halves(size=(40, 20)) -> Image.Image:
    """Left half red, right half blue."""
    image = Image.new("RGB", size, RED)
    image.paste(BLUE, (size[0] // 2, 0, size[0], size[1]))
    return image


def _save(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def _close(pixel, want, tol=24) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(pixel, want, strict=True))


SAMPLES = {
    "image/png": lambda: _save(_halves(), "PNG"),
    "image/jpeg": lambda: _save(_halves(), "JPEG", quality=95),
    "image/gif": lambda: _save(_halves(), "GIF"),
    "image/webp": lambda: _save(_halves(), "WEBP", lossless=True),
    "image/bmp": lambda: _save(_halves(), "BMP"),
}


@pytest.mark.parametrize("mime", sorted(SAMPLES))
def test_each_format_decodes_to_rgb_of_its_size(mime):
    data = SAMPLES[mime]()
    item = _decode(data, mime)
    assert isinstance(item, ImageItem) and item.image.mode == "RGB"
    assert (item.width, item.height) == item.image.size == (40, 20)
    assert item.digest == MediaBlob.of(data, mime, "data").digest
    assert _close(item.image.getpixel((5, 10)), RED), item.image.getpixel((5, 10))
    assert _close(item.image.getpixel((35, 10)), BLUE), item.image.getpixel((35, 10))


def test_a_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), BLUE)]
    data = _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert _decode(data, "image/gif").image.getpixel((4, 4)) == RED


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: the left edge on top
    data = _save(_halves(), "JPEG", quality=95, exif=exif.tobytes())
    item = _decode(data, "image/jpeg")
    assert (item.width, item.height) == (20, 40)
    assert _close(item.image.getpixel((10, 5)), RED), item.image.getpixel((10, 5))
    assert _close(item.image.getpixel((10, 35)), BLUE), item.image.getpixel((10, 35))


def test_transparency_is_composited_on_white():
    rgba = Image.new("RGBA", (4, 1), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 128))
    rgba.putpixel((2, 0), (0, 0, 255, 255))
    item = _decode(_save(rgba, "PNG"), "image/png")
    pixels = [item.image.getpixel((x, 0)) for x in range(3)]
    assert pixels[0] == (255, 255, 255)
    assert _close(pixels[1], (255, 127, 127), tol=2), pixels[1]
    assert pixels[2] == BLUE
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0])
    palette.putpixel((1, 0), 1)
    item = _decode(_save(palette, "PNG", transparency=0), "image/png")
    assert [item.image.getpixel((x, 0)) for x in range(2)] == [(255, 255, 255), RED]


def test_sixteen_bit_grey_keeps_its_range():
    grey = Image.fromarray(np.array([[0, 32768, 65535]], dtype=np.uint16))
    assert grey.mode == "I;16"
    item = _decode(_save(grey, "PNG"), "image/png")
    assert [item.image.getpixel((x, 0)) for x in range(3)] == \
        [(0, 0, 0), (128, 128, 128), (255, 255, 255)]


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels and holds almost none."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


@pytest.fixture
def loads(monkeypatch):
    """Every ``ImageFile.load`` call, each refused: a bomb must never reach one."""
    calls = []

    def spy(self):
        calls.append(self.size)
        raise AssertionError("decoded")
    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return calls


@pytest.mark.parametrize(("size", "named"), [
    ((100_000, 100_000), "--max-image-width"),
    ((16_000, 16_000), "decoded pixels"),  # within the sides, over the pixel bound
])
def test_a_decompression_bomb_is_refused_from_its_header(loads, size, named):
    data = _png_header(*size)
    assert len(data) < 200
    started = time.perf_counter()
    exc = _refused(data, "image/png")
    assert time.perf_counter() - started < 0.5
    assert named in exc.message and f"{size[0]}" in exc.message, exc.message
    assert loads == []


def test_sizes_over_the_flags_are_refused_naming_them():
    wide, high = _save(Image.new("RGB", (300, 10)), "PNG"), _save(Image.new("RGB", (10, 300)),
                                                                   "PNG")
    limits = MediaLimits(max_width=200, max_height=200)
    assert "--max-image-width (200)" in _refused(wide, limits=limits).message
    assert "--max-image-height (200)" in _refused(high, limits=limits).message
    assert _decode(wide, limits=MediaLimits(max_width=300)).width == 300
    assert "decoded pixels" in _refused(wide, limits=MediaLimits(max_pixels=2999)).message
    flags = SimpleNamespace(max_image_width=5, max_image_height=6)
    assert MediaLimits.of(flags) == MediaLimits(max_width=5, max_height=6)


def test_a_rotation_that_turns_a_width_into_an_over_limit_height_is_refused():
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _save(Image.new("RGB", (300, 10)), "JPEG", exif=exif.tobytes())
    limits = MediaLimits(max_width=300, max_height=200)
    assert "--max-image-height (200)" in _refused(data, limits=limits).message


@pytest.mark.parametrize("mime", sorted(SAMPLES))
def test_truncated_and_corrupt_bytes_are_refused_without_quoting_them(mime):
    data = SAMPLES[mime]()
    exc = _refused(data[:len(data) // 2], mime)
    assert "could not be decoded" in exc.message, exc.message
    secret = b"SECRET-TOKEN-1234" * 4
    exc = _refused(data[:32] + secret, mime)  # corrupt, or a garbage size
    assert "SECRET" not in exc.message and "TOKEN" not in exc.message, exc.message


def test_a_declared_type_that_disagrees_with_the_bytes_is_refused():
    jpeg = SAMPLES["image/jpeg"]()
    exc = _refused(jpeg, "image/png")
    assert "image/jpeg" in exc.message and "image/png" in exc.message, exc.message
    assert "video/mp4" in _refused(jpeg, "video/mp4").message
    assert "a malformed type" in _refused(jpeg, "image/png<script>" * 9).message
    # an absent or generic type, an alias and parameters are not a disagreement
    for mime in ("", "application/octet-stream", "image/jpg", "IMAGE/JPEG; q=1"):
        assert _decode(jpeg, mime).width == 40, mime


def test_bytes_of_no_image_type_are_refused():
    exc = _refused(b"password=hunter2\n" * 8, "text/plain")
    assert "not an image of a type this server decodes" in exc.message
    assert "image/png" in exc.message and "hunter2" not in exc.message
    assert "not an image" in _refused(b"just text", "image/png").message
    tiff = _save(Image.new("RGB", (4, 4)), "TIFF")
    assert "not an image" in _refused(tiff, "image/tiff").message


def test_the_image_count_over_max_images_is_refused():
    check_image_count(16, 16)
    with pytest.raises(InvalidRequest) as err:
        check_image_count(17, 16)
    assert "--max-images (16)" in err.value.message and err.value.param == "messages"


# -- a third party's decoder ----------------------------------------------------------------
# "image/x-acme": b"ACME", width and height (u16), then raw RGB


def _acme(size=(3, 2), color=(9, 8, 7)) -> bytes:
    return b"ACME" + struct.pack(">HH", *size) + bytes(color) * (size[0] * size[1])


def acme_decode(blob, limits):
    width, height = struct.unpack(">HH", blob.data[4:8])
    check_image_size(width, height, limits)
    raw = blob.data[8:]
    if len(raw) != width * height * 3:
        raise ValueError("short pixel data")
    image = Image.frombytes("RGB", (width, height), raw)
    return ImageItem(image=image, width=width, height=height, digest=blob.digest)


def grey_png_decode(blob, limits):
    image = Image.new("RGB", (1, 1), (77, 77, 77))
    return ImageItem(image=image, width=1, height=1, digest=blob.digest)


ACME = MediaDecoder(name="acme", kind="image", mimes={"image/x-acme": rb"ACME"},
                    decode=f"{__name__}:acme_decode")
PNG_SIGNATURE = {"image/png": rb"\x89PNG\r\n\x1a\n"}


def test_a_third_party_decoder_adds_a_type_with_no_core_edit():
    refused = _refused(_acme(), "image/x-acme")
    assert "not an image" in refused.message
    registry = _registry(ACME)
    item = _decode(_acme(), "image/x-acme", registry=registry)
    assert (item.width, item.height) == (3, 2) and item.image.getpixel((2, 1)) == (9, 8, 7)
    assert "image/x-acme" in registry.mimes("image")
    assert registry.owner("acme") == "unit-extra"


@pytest.mark.parametrize(("priority", "winner"), [(10, "grey-png"), (-1, "pillow")])
def test_the_highest_priority_decoder_takes_a_format(priority, winner):
    grey = MediaDecoder(name="grey-png", kind="image", mimes=PNG_SIGNATURE,
                        decode=f"{__name__}:grey_png_decode", priority=priority)
    registry = _registry(grey)
    png = SAMPLES["image/png"]()
    assert registry.select("image", png)[0].name == winner
    assert [d.name for d in registry.for_kind("image")][0] == \
        ("grey-png" if priority > 0 else "pillow")
    item = _decode(png, "image/png", registry=registry)
    assert (item.width == 1) == (winner == "grey-png")


def test_registration_refuses_a_tie_and_malformed_decoders():
    tie = MediaDecoder(name="other-png", kind="image", mimes=PNG_SIGNATURE, decode="m:f")
    with pytest.raises(PluginError) as err:
        _registry(tie)
    assert "'pillow' (from 'media-builtin')" in str(err.value)
    assert "'other-png' (from 'unit-extra')" in str(err.value)
    _registry(MediaDecoder(name="video-png", kind="video", mimes=PNG_SIGNATURE,
                           decode="m:f"))  # another kind: no tie
    bad = [
        (dict(kind="hologram"), "unknown kind"),
        (dict(mimes={}), "no MIME type"),
        (dict(mimes={"Image/X": rb"x"}), "lowercase MIME type"),
        (dict(mimes={"image/x": rb"("}), "not a regex"),
        (dict(mimes={"image/x": "x"}), "non-empty bytes"),
        (dict(decode="no_attr_here"), "'module:attr'"),
    ]
    for fields, message in bad:
        spec = {"name": "bad", "kind": "image", "mimes": {"image/x-bad": rb"BAD"},
                "decode": "m:f", **fields}
        with pytest.raises(PluginError, match=message):
            _registry(MediaDecoder(**spec))


def test_core_registers_its_decoder_through_its_entry_point():
    from mlxcel.plugins import load_plugins

    plugins = load_plugins()
    pillow = plugins.media_decoders.get("pillow")
    assert plugins.media_decoders.owner("pillow") == "media-builtin"
    assert pillow.decode == "mlxcel.media.image:decode"
    assert sorted(pillow.mimes) == sorted(SAMPLES)
    assert "pillow" not in load_plugins(deny="media-builtin").media_decoders


# -- the conformance runner -----------------------------------------------------------------


def test_core_and_the_acme_decoder_pass_check_media_decoder():
    check_media_decoder("pillow", [(SAMPLES[m](), m) for m in sorted(SAMPLES)])
    check_media_decoder(ACME, [_acme((5, 4)), (_acme((2, 9)), "image/x-acme")])


def unchecked_decode(blob, limits):  # decodes whatever size the header declares
    width, height = struct.unpack(">HH", blob.data[4:8])
    return acme_decode(blob, MediaLimits(max_width=1 << 16, max_height=1 << 16,
                                         max_pixels=1 << 32)) if width and height else None


def other_digest_decode(blob, limits):
    item = acme_decode(blob, limits)
    return ImageItem(image=item.image, width=item.width, height=item.height,
                     digest=b"\x00" * 32)


def rgba_decode(blob, limits):
    item = acme_decode(blob, limits)
    return ImageItem(image=item.image.convert("RGBA"), width=item.width,
                     height=item.height, digest=blob.digest)


def noisy_decode(blob, limits):
    item = acme_decode(blob, limits)
    noise = np.random.default_rng().integers(0, 255, (item.height, item.width, 3),
                                             dtype=np.uint8)
    return ImageItem(image=Image.fromarray(noise), width=item.width, height=item.height,
                     digest=blob.digest)


def padding_decode(blob, limits):  # takes a truncated file, padding it
    width, height = struct.unpack(">HH", blob.data[4:8])
    check_image_size(width, height, limits)
    raw = blob.data[8:].ljust(width * height * 3, b"\x00")
    return ImageItem(image=Image.frombytes("RGB", (width, height), raw), width=width,
                     height=height, digest=blob.digest)


def wrong_item_decode(blob, limits):
    return acme_decode(blob, limits).image


@pytest.mark.parametrize(("decode", "message"), [
    ("unchecked_decode", "must check the size its header declares"),
    ("other_digest_decode", "without the blob's digest"),
    ("rgba_decode", "mode RGBA, not RGB"),
    ("noisy_decode", "decoding it twice differs"),
    ("padding_decode", "cut in half, is not refused"),
    ("wrong_item_decode", "returned Image, not ImageItem"),
])
def test_check_media_decoder_fails_a_broken_decoder(decode, message):
    broken = MediaDecoder(name="broken", kind="image", mimes={"image/x-acme": rb"ACME"},
                          decode=f"{__name__}:{decode}")
    with pytest.raises(AssertionError, match=message):
        check_media_decoder(broken, [_acme((6, 5))])


def test_check_media_decoder_fails_samples_it_does_not_take():
    with pytest.raises(AssertionError, match="no signature"):
        check_media_decoder(ACME, [SAMPLES["image/png"]()])
    with pytest.raises(AssertionError, match="unknown kind"):
        check_media_decoder(MediaDecoder(name="x", kind="smell", mimes={"image/x": b"x"},
                                         decode="m:f"), [b"x"])


def test_a_decoder_that_breaks_the_contract_is_a_server_error_not_a_400():
    broken = MediaDecoder(name="broken", kind="image", mimes={"image/x-acme": rb"ACME"},
                          decode=f"{__name__}:other_digest_decode")
    with pytest.raises(MlxcelError) as err:
        _decode(_acme(), registry=_registry(broken))
    assert err.value.status == 500 and "'broken'" in err.value.message
