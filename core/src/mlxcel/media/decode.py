"""From a fetched blob to a decoded item: core picks the decoder by the bytes, runs it
under the limits, and turns every refusal into a 400 that names the content part.

The bytes decide, not the declared MIME type: a blob whose bytes no decoder's signature
matches is refused, and so is one whose declared type names another format than its
bytes are (``image/png`` holding a JPEG), since a client or a server that mislabels one
may mislabel it on purpose. An absent or generic type (``application/octet-stream``) and
the usual aliases (``image/jpg``) are not a disagreement. A message never quotes the
bytes, nor a decoder's own error text, which may.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from mlxcel.errors import InvalidRequest, MlxcelError
from mlxcel.lazy import resolve
from mlxcel.media.api import (
    ITEM_TYPES,
    MediaDecoder,
    MediaItem,
    MediaLimits,
    MediaRefused,
    check_image_size,
)
from mlxcel.media.recent import Recent
from mlxcel.media.registry import MediaDecoderRegistry
from mlxcel.types.media import MediaBlob

log = structlog.get_logger("mlxcel.media")

# declared types that say nothing about the format
GENERIC_MIMES = frozenset({"", "application/octet-stream", "binary/octet-stream"})
# common spellings of one format
ALIASES = {
    "image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png",
    "image/x-bmp": "image/bmp", "image/x-ms-bmp": "image/bmp", "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav", "audio/vnd.wave": "audio/wav", "audio/mp3": "audio/mpeg",
    "audio/x-flac": "audio/flac", "image/x-icon": "image/vnd.microsoft.icon",
}
# decoded images kept for the next turn of a conversation (``recent_images``): an RGB
# 1080p screenshot holds ~6 MB
RECENT_IMAGES = 32
RECENT_BYTES = 128 << 20
_SHOWN = re.compile(r"[\w.+-]{1,40}/[\w.+-]{1,40}")


def decode_media(blob: MediaBlob, kind: str, registry: MediaDecoderRegistry,
                 limits: MediaLimits, part: str, recent: Recent[Any] | None = None
                 ) -> MediaItem:
    """Decode ``blob`` as a ``kind`` item with the decoder its bytes select; ``part`` is
    the content part's path (``messages[0].content[1]``), the ``param`` of every 400.

    Refused (``MediaRefused``, 400): bytes of no type a decoder of ``kind`` takes, a
    declared type that disagrees with them, a size over ``limits``, bytes the decoder
    cannot read. A decoder that breaks its contract (wrong item, wrong digest) is a 500.
    ``recent``: images decoded lately (``mlxcel.media.recent``), by digest, decoder and
    limits; the bytes and the declared type are still checked first, every time.
    It is CPU work (Pillow decodes here): call it off the event loop.
    """
    decoder, mime = _pick(blob, kind, registry, part)
    if recent is None or kind != "image":
        return _decode(decoder, mime, blob, kind, limits, part)
    return recent.get((blob.digest, decoder.name, limits),
                      lambda: _decode(decoder, mime, blob, kind, limits, part))


def recent_images() -> Recent[Any]:
    """The server's memo of decoded images (``RECENT_IMAGES``, ``RECENT_BYTES``)."""
    return Recent(RECENT_IMAGES, RECENT_BYTES, lambda item: item.width * item.height * 3)


def _decode(decoder: MediaDecoder, mime: str, blob: MediaBlob, kind: str,
            limits: MediaLimits, part: str) -> MediaItem:
    decode = resolve(decoder.decode)  # a missing module is the server's fault, not a 400
    try:
        item = decode(blob, limits)
    except InvalidRequest as exc:
        raise MediaRefused(f"{part}: {exc.message}", param=part) from None
    except Exception as exc:  # any reader's error on hostile bytes is the bytes' fault
        log.info("media_decode_failed", decoder=decoder.name, mime=mime,
                 error=type(exc).__name__)
        raise MediaRefused(f"{part}: the {mime} data could not be decoded (corrupt or "
                           "truncated)", param=part) from None
    _check_item(item, kind, blob, limits, decoder.name, part)
    return item


def check_image_count(count: int, max_images: int, param: str = "messages") -> None:
    """Refuse a request with more than ``--max-images`` images (400 naming the flag)."""
    if count > max_images:
        raise InvalidRequest(f"the request has {count} images, over --max-images "
                             f"({max_images})", param=param)


def declared_type(mime: str) -> str:
    """A declared MIME type as compared: lowercase, no parameters, aliases resolved."""
    base = mime.split(";", 1)[0].strip().lower()
    return ALIASES.get(base, base)


def _pick(blob: MediaBlob, kind: str, registry: MediaDecoderRegistry,
          part: str) -> tuple[MediaDecoder, str]:
    picked = registry.select(kind, blob.data)
    declared = declared_type(blob.mime)
    if picked is None:
        supported = ", ".join(registry.mimes(kind)) or "none"
        raise MediaRefused(f"{part}: the data is not {_article(kind)} of a type this "
                           f"server decodes ({supported})", param=part)
    decoder, mime = picked
    if declared not in GENERIC_MIMES and declared != mime:
        raise MediaRefused(f"{part}: the data is {mime}, but its declared type is "
                           f"{_shown(declared)}", param=part)
    return decoder, mime


def _check_item(item: object, kind: str, blob: MediaBlob, limits: MediaLimits,
                decoder: str, part: str) -> None:
    """The decoder kept the contract, and the decoded size is within the limits (the
    header's was; an EXIF rotation may turn a width into a height)."""
    want = ITEM_TYPES[kind]
    if not isinstance(item, want):
        raise MlxcelError(f"media decoder '{decoder}' returned {type(item).__name__}, not "
                          f"{want.__name__}")
    if item.digest != blob.digest:
        raise MlxcelError(f"media decoder '{decoder}' returned an item without the blob's "
                          "digest")
    sizes = [(item.width, item.height)] if kind == "image" else \
        [f.size for f in item.frames] if kind == "video" else []
    try:
        for width, height in sizes:
            check_image_size(width, height, limits)
    except MediaRefused as exc:
        raise MediaRefused(f"{part}: {exc.message}", param=part) from None


def _article(kind: str) -> str:
    return {"image": "an image", "video": "a video", "audio": "audio"}.get(kind, kind)


def _shown(mime: str) -> str:
    return mime if _SHOWN.fullmatch(mime) else "a malformed type"
