"""Media decoder conformance runner (re-exported by ``mlxcel.testing.conformance``).

``check_media_decoder(decoder, samples)``: media decoder contract v2 (``mlxcel.media.api``)
on sample files of the decoder's formats (single-frame stills for an image decoder). The
decoder registers (a known kind, lowercase MIME types, signatures that compile) and its
``decode`` resolves. Each sample's bytes select it by a signature, and decoded the way
core decodes a content part (``mlxcel.media.decode.decode_media``) it gives the item of
its kind with the blob's digest and sane fields: an RGB image of its stated size; RGB
frames of one size and an fps above 0; finite mono float32 PCM in [-1, 1] at a rate
above 0. Decoding it again gives the same pixels or samples. Its first half is refused
with a 400 that names the content part and quotes no byte. An image or a video is
refused by ``decode`` itself under limits one pixel short of its size (the decoder
checks the size its header declares, so a bomb is never decoded), and through core under
a width or a height one short, naming the flag. Each check raises ``AssertionError``
naming the sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from mlxcel.errors import InvalidRequest, MlxcelError, PluginError
from mlxcel.lazy import resolve
from mlxcel.media.api import MediaDecoder, MediaLimits
from mlxcel.media.decode import decode_media
from mlxcel.media.registry import MediaDecoderRegistry
from mlxcel.types.media import MediaBlob

PART = "messages[0].content[1]"


def check_media_decoder(decoder: MediaDecoder | str, samples: Iterable[Any]) -> None:
    """Run the decoder checks (see the module docstring) on every sample.

    ``decoder``: a ``MediaDecoder``, or an installed decoder's name; ``samples``: the
    bytes of files it decodes, as ``bytes``, ``(bytes, declared_mime)`` or ``MediaBlob``.
    """
    dec = _installed(decoder) if isinstance(decoder, str) else decoder
    registry = MediaDecoderRegistry()
    registry.current_owner = "check_media_decoder"
    try:
        registry.add(dec)
    except PluginError as exc:
        raise AssertionError(str(exc)) from None
    assert callable(resolve(dec.decode)), f"{dec.name}: {dec.decode} is not callable"
    blobs = [_blob(s) for s in samples]
    assert blobs, "check_media_decoder needs at least one sample"
    for n, blob in enumerate(blobs):
        where = f"{dec.name} sample {n}"
        assert registry.select(dec.kind, blob.data) is not None, \
            f"{where}: no signature of {sorted(dec.mimes)} matches its bytes"
        item = _decoded(blob, dec.kind, registry, MediaLimits(), where)
        _check_fields(item, dec.kind, blob, where)
        again = _decoded(blob, dec.kind, registry, MediaLimits(), where)
        assert _content(again) == _content(item), f"{where}: decoding it twice differs"
        _check_truncated(blob, dec.kind, registry, where)
        if dec.kind in ("image", "video"):
            _check_limits(blob, dec, registry, _size(item), where)


def _installed(name: str) -> MediaDecoder:
    from mlxcel.plugins import load_plugins

    decoders = load_plugins().media_decoders
    assert name in decoders, f"no installed media decoder {name!r} (installed: " \
                             f"{sorted(decoders)})"
    return decoders.get(name)


def _blob(sample: Any) -> MediaBlob:
    if isinstance(sample, MediaBlob):
        return sample
    data, mime = (sample, "") if isinstance(sample, bytes | bytearray) else sample
    return MediaBlob.of(bytes(data), mime, "data")


def _decoded(blob: MediaBlob, kind: str, registry: MediaDecoderRegistry,
             limits: MediaLimits, where: str) -> Any:
    try:
        return decode_media(blob, kind, registry, limits, PART)
    except InvalidRequest as exc:
        raise AssertionError(f"{where} is refused: {exc.message}") from None
    except MlxcelError as exc:  # the decoder broke its contract (core answers 500)
        raise AssertionError(f"{where}: {exc.message}") from None


def _check_fields(item: Any, kind: str, blob: MediaBlob, where: str) -> None:
    assert item.digest == blob.digest, f"{where}: the item's digest is not the blob's"
    if kind == "image":
        assert item.width > 0 and item.height > 0, f"{where}: size {item.width}x{item.height}"
        assert item.image.mode == "RGB", f"{where}: mode {item.image.mode}, not RGB"
        assert item.image.size == (item.width, item.height), \
            f"{where}: the image is {item.image.size}, the item says " \
            f"{(item.width, item.height)}"
    elif kind == "video":
        assert item.frames, f"{where}: no frames"
        assert {f.mode for f in item.frames} == {"RGB"}, f"{where}: frames not all RGB"
        assert len({f.size for f in item.frames}) == 1, f"{where}: frames of several sizes"
        assert math.isfinite(item.fps) and item.fps > 0, f"{where}: fps {item.fps}"
    else:
        pcm = item.pcm
        assert isinstance(pcm, np.ndarray) and pcm.dtype == np.float32 and pcm.ndim == 1, \
            f"{where}: pcm must be a one-dimensional float32 array"
        assert pcm.size and np.isfinite(pcm).all(), f"{where}: empty or non-finite pcm"
        assert np.abs(pcm).max() <= 1.0 + 1e-6, f"{where}: pcm outside [-1, 1]"
        assert item.sample_rate > 0, f"{where}: sample rate {item.sample_rate}"


def _content(item: Any) -> tuple:
    if hasattr(item, "image"):
        return item.image.size, item.image.tobytes()
    if hasattr(item, "frames"):
        return item.fps, tuple((f.size, f.tobytes()) for f in item.frames)
    return item.sample_rate, item.pcm.tobytes()


def _size(item: Any) -> tuple[int, int]:
    return (item.width, item.height) if hasattr(item, "image") else item.frames[0].size


def _refusal(blob: MediaBlob, kind: str, registry: MediaDecoderRegistry,
             limits: MediaLimits, where: str) -> InvalidRequest:
    try:
        decode_media(blob, kind, registry, limits, PART)
    except InvalidRequest as exc:
        assert exc.status == 400 and exc.param == PART, \
            f"{where}: refused with {exc.status}, param {exc.param!r}"
        assert exc.message.startswith(f"{PART}: "), f"{where}: {exc.message!r}"
        return exc
    raise AssertionError(f"{where} is not refused")


def _check_truncated(blob: MediaBlob, kind: str, registry: MediaDecoderRegistry,
                     where: str) -> None:
    cut = MediaBlob.of(blob.data[:len(blob.data) // 2], blob.mime, blob.source)
    exc = _refusal(cut, kind, registry, MediaLimits(), f"{where}, cut in half,")
    shown = exc.message.encode("utf-8", "replace")
    for i in range(0, max(len(cut.data) - 16, 0), 8):
        window = cut.data[i:i + 16]
        assert len(set(window)) == 1 or window not in shown, \
            f"{where}: the refusal quotes the bytes: {exc.message!r}"


def _check_limits(blob: MediaBlob, dec: MediaDecoder, registry: MediaDecoderRegistry,
                  size: tuple[int, int], where: str) -> None:
    width, height = size
    tight = MediaLimits(max_pixels=width * height - 1)
    try:
        resolve(dec.decode)(blob, tight)
    except InvalidRequest:
        pass
    else:
        raise AssertionError(f"{where}: decode() took {width}x{height} pixels under "
                             f"max_pixels={width * height - 1}: it must check the size "
                             "its header declares (mlxcel.media.api.check_image_size)")
    for limits, flag in ((MediaLimits(max_width=width - 1), "--max-image-width"),
                         (MediaLimits(max_height=height - 1), "--max-image-height")):
        exc = _refusal(blob, dec.kind, registry, limits, f"{where} under {flag}")
        assert flag in exc.message, f"{where}: the refusal does not name {flag}: " \
                                    f"{exc.message!r}"
