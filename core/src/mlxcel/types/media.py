"""A media part's bytes, as core fetched them (``mlxcel.media.fetch``), before any decoder
has looked at them."""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

# where the bytes came from: a data: URI (or inline base64), an http(s) URL, a local file
MediaSource = Literal["data", "http", "file"]


class MediaBlob(msgspec.Struct, frozen=True):
    """The bytes of one media part, their MIME type as the source declared it (a decoder
    checks it), their sha256 (the key of the vision cache and of the prompt cache's block
    hashes) and the kind of source, never the URL or the path itself: a blob may be
    logged, and a URL or a path may carry what the caller did not mean to show."""

    data: bytes
    mime: str
    digest: bytes  # sha256 of data
    source: MediaSource

    @classmethod
    def of(cls, data: bytes, mime: str, source: MediaSource) -> MediaBlob:
        """A blob of ``data``, its digest computed here."""
        return cls(data=data, mime=mime, digest=hashlib.sha256(data).digest(), source=source)

    def __repr__(self) -> str:  # never the bytes themselves (a log line, an error)
        return (f"MediaBlob({len(self.data)} bytes, mime={self.mime!r}, "
                f"digest={self.digest.hex()[:16]}, source={self.source!r})")
