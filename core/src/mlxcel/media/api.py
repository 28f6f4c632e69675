"""Media decoder contract: turn an image/video/audio source into a decoded item."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

MediaKind = Literal["image", "video", "audio"]


class MediaPolicy(msgspec.Struct, frozen=True, kw_only=True):
    allow_local_paths: bool = False
    allow_remote: bool = True
    max_bytes: int = 25 * 1024 * 1024


class MediaItem(msgspec.Struct, frozen=True, kw_only=True):
    kind: MediaKind
    data: Any
    metadata: dict[str, Any] = {}


class MediaDecoder(msgspec.Struct, frozen=True, kw_only=True):
    """``decode`` is a ``"module:attr"`` naming ``decode(source, policy) -> MediaItem``."""

    name: str
    kind: MediaKind
    decode: str
