"""Core's image decoder, on Pillow: PNG, JPEG, GIF (its first frame), WebP and BMP.

Each format is read by its own Pillow reader alone, picked by the signature of the bytes,
so no other Pillow reader ever parses them. The reader parses the header only; the size it
declares is checked against the limits before ``load()`` decodes a pixel. The result is
RGB: EXIF orientation applied, transparency composited on white (what a viewer shows).

Pillow is imported when the first image is decoded: the entry point
(``mlxcel.builtin.media``) imports this module for ``SIGNATURES`` only.
"""

from __future__ import annotations

import importlib
import io
import re
import struct
import zlib
from typing import Any

from mlxcel.media.api import ImageItem, MediaLimits, MediaRefused, check_image_size
from mlxcel.types.media import MediaBlob

# MIME type -> the signature of its bytes (a regex matched at the first byte)
SIGNATURES: dict[str, bytes] = {
    "image/png": rb"\x89PNG\r\n\x1a\n",
    "image/jpeg": rb"\xff\xd8\xff",
    "image/gif": rb"GIF8[79]a",
    "image/webp": rb"RIFF.{4}WEBP",
    # "BM", then a DIB header of one of the sizes Windows and OS/2 define
    "image/bmp": rb"BM.{12}(?:\x0c|\x10|\x28|\x34|\x38|\x40|\x6c|\x7c)\x00\x00\x00",
}
# MIME type -> (Pillow plugin module, its reader class)
READERS = {
    "image/png": ("PngImagePlugin", "PngImageFile"),
    "image/jpeg": ("JpegImagePlugin", "JpegImageFile"),
    "image/gif": ("GifImagePlugin", "GifImageFile"),
    "image/webp": ("WebPImagePlugin", "WebPImageFile"),
    "image/bmp": ("BmpImagePlugin", "BmpImageFile"),
}
_COMPILED = {mime: re.compile(sig, re.DOTALL) for mime, sig in SIGNATURES.items()}
# what Pillow raises on bytes it cannot read (DecompressionBombError is a RuntimeError)
_UNREADABLE = (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError,
               struct.error, zlib.error, RuntimeError)


def sniff(data: bytes) -> str | None:
    """The MIME type of ``data`` by its signature, or None."""
    return next((m for m, sig in _COMPILED.items() if sig.match(data[:64])), None)


def decode(blob: MediaBlob, limits: MediaLimits) -> ImageItem:
    """``blob`` as an RGB ``ImageItem``, refused (``MediaRefused``) when its header's size
    is over ``limits`` or its bytes do not decode."""
    mime = sniff(blob.data)
    if mime is None:
        raise MediaRefused("the data is not a PNG, JPEG, GIF, WebP or BMP image")
    label = mime.partition("/")[2].upper()
    try:
        image = _reader(mime)(io.BytesIO(blob.data))  # parses the header only
    except _UNREADABLE:
        raise MediaRefused(f"the {label} data could not be decoded (corrupt)") from None
    check_image_size(image.width, image.height, limits)
    try:
        image.load()  # a GIF or WebP reader stands on the first frame
        rgb = to_rgb(_oriented(image))
    except _UNREADABLE:
        raise MediaRefused(f"the {label} data could not be decoded (corrupt or "
                           "truncated)") from None
    return ImageItem(image=rgb, width=rgb.width, height=rgb.height, digest=blob.digest)


def to_rgb(image: Any) -> Any:
    """``image`` in mode RGB: transparency composited on white, 16-bit grey scaled to 8."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16L", "I;16B"):
        import numpy as np

        grey = (np.asarray(image).astype(np.uint32) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _oriented(image: Any) -> Any:
    from PIL import ImageOps

    return ImageOps.exif_transpose(image)


def plain(width: int, height: int, rgb: tuple[int, int, int] = (128, 128, 128)) -> ImageItem:
    """An image of one colour as ``decode`` makes it from a PNG: what the engine's warm-up
    and the conformance kit give a model's decoder where no client sent an image."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(out, "PNG")
    return decode(MediaBlob.of(out.getvalue(), "image/png", "data"), MediaLimits())


def _reader(mime: str) -> Any:
    module, cls = READERS[mime]
    return getattr(importlib.import_module(f"PIL.{module}"), cls)
