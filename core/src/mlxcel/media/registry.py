"""Media decoder registry."""

from __future__ import annotations

from mlxcel.media.api import MediaDecoder, MediaKind
from mlxcel.registry import Registry


class MediaDecoderRegistry(Registry[MediaDecoder]):
    def __init__(self) -> None:
        super().__init__("media decoder")

    def for_kind(self, kind: MediaKind) -> list[MediaDecoder]:
        return [d for _, d in self.items() if d.kind == kind]
