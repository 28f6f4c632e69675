"""The media input's rows of the options table (``mlxcel.options``): where local files may
be read (``--media-path``), whether remote URLs may reach non-public addresses, and the
per-image and per-request limits (``mlxcel.media.fetch`` and the decoders). Row format as
the table's: (flags, dest, type, default, env twin, help[, llama kind[, second env twin]]).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mlxcel.option_types import Toggle, byte_size


def media_roots(raw: str) -> tuple[str, ...]:
    """Comma-separated directories, each resolved (symlinks too) once, at startup, so
    a request's path is compared with what the roots really are; one that is not an
    existing directory refuses to start."""
    roots = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            root = Path(item).resolve(strict=True)
        except (OSError, RuntimeError):
            root = None
        if root is None or not root.is_dir():
            raise argparse.ArgumentTypeError(f"not an existing directory: {item!r}")
        roots.append(str(root))
    return tuple(dict.fromkeys(roots))


def _at_least(low: int) -> Any:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {raw!r}")
        return value

    parse.__name__ = f"count_from_{low}"
    return parse


MEDIA_ROWS: tuple[tuple[Any, ...], ...] = (
    (("--media-path",), "media_path", media_roots, (), "MLXCEL_MEDIA_PATH",
     "comma-separated directories that file:// URLs and absolute paths of media parts "
     "may be read from, symlinks resolved (unset: local media files are refused)"),
    (("--allow-private-media-urls",), "allow_private_media_urls", Toggle(), False,
     "MLXCEL_ALLOW_PRIVATE_MEDIA_URLS",
     "let remote media URLs reach non-public addresses (loopback, LAN, link-local, cloud "
     "metadata); without it they are refused before connecting: for trusted callers only"),
    (("--max-image-payload-size",), "max_image_payload_size", byte_size, 64 << 20,
     "LLAMA_ARG_MAX_IMAGE_PAYLOAD_SIZE",
     "bytes one media part may have (data: URI, URL or file, e.g. 64M); more is a 400"),
    (("--max-images",), "max_images", _at_least(1), 16, "LLAMA_ARG_MAX_IMAGES",
     "images one request may carry; more is a 400"),
    (("--max-image-width",), "max_image_width", _at_least(1), 16384,
     "LLAMA_ARG_MAX_IMAGE_WIDTH", "widest image, in pixels, a request may carry; wider is a 400"),
    (("--max-image-height",), "max_image_height", _at_least(1), 16384,
     "LLAMA_ARG_MAX_IMAGE_HEIGHT",
     "tallest image, in pixels, a request may carry; taller is a 400"),
    (("--vision-cache-size",), "vision_cache_size", _at_least(0), 20,
     "MLXCEL_VISION_CACHE_SIZE",
     "images whose vision features are kept, by digest, per model (0: none)"),
)
