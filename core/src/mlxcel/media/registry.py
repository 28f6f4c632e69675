"""Media decoder registry: decoders by kind, and which one takes a blob's bytes."""

from __future__ import annotations

import re

from mlxcel.errors import PluginError
from mlxcel.media.api import MEDIA_KINDS, MediaDecoder
from mlxcel.registry import Registry

SNIFF_BYTES = 512  # how much of a blob a signature sees
_MIME = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")


class MediaDecoderRegistry(Registry[MediaDecoder]):
    def __init__(self) -> None:
        super().__init__("media decoder")
        self._signatures: dict[str, list[tuple[str, re.Pattern[bytes]]]] = {}
        self._order: dict[str, int] = {}

    def add(self, item: MediaDecoder) -> None:  # type: ignore[override]
        """Refuse an unknown kind, a decoder with no format, a malformed MIME type or
        signature, and a MIME type that another decoder of the same kind lists at the
        same priority (neither would take it before the other)."""
        owner = self.current_owner
        where = self.check_kind_and_ref(item, MEDIA_KINDS, "decode")
        if not isinstance(item.mimes, dict) or not item.mimes:
            raise PluginError(f"{where} lists no MIME type")
        signatures = [(mime, _compile(where, mime, pattern))
                      for mime, pattern in item.mimes.items()]
        for key, other in self.items():
            shared = set(item.mimes) & set(other.mimes)
            if other.kind == item.kind and other.priority == item.priority and shared:
                raise PluginError(
                    f"media type '{sorted(shared)[0]}' is taken at priority {item.priority} "
                    f"by decoder '{key}' (from '{self.owner(key)}') and by '{item.name}' "
                    f"(from '{owner}'); give one a higher priority")
        super().add(item)
        self._signatures[item.name] = signatures
        self._order[item.name] = len(self._order)

    def for_kind(self, kind: str) -> list[MediaDecoder]:
        """The decoders of ``kind``, highest priority first (then in registration order)."""
        found = [d for _, d in self.items() if d.kind == kind]
        return sorted(found, key=lambda d: (-d.priority, self._order[d.name]))

    def mimes(self, kind: str) -> list[str]:
        """Every MIME type a decoder of ``kind`` takes, sorted."""
        return sorted({m for d in self.for_kind(kind) for m in d.mimes})

    def select(self, kind: str, data: bytes) -> tuple[MediaDecoder, str] | None:
        """The decoder of ``kind`` that takes ``data``, and the MIME type its bytes are:
        the highest-priority decoder one of whose signatures matches; None if none does."""
        head = data[:SNIFF_BYTES]
        for decoder in self.for_kind(kind):
            for mime, pattern in self._signatures[decoder.name]:
                if pattern.match(head):
                    return decoder, mime
        return None


def _compile(where: str, mime: str, pattern: object) -> re.Pattern[bytes]:
    if not isinstance(mime, str) or not _MIME.fullmatch(mime):
        raise PluginError(f"{where}: {mime!r} is not a lowercase MIME type (type/subtype)")
    if not isinstance(pattern, bytes) or not pattern:
        raise PluginError(f"{where}: the signature of {mime} must be non-empty bytes")
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise PluginError(f"{where}: the signature of {mime} is not a regex: {exc}") from None
