"""A media part's bytes, as core fetched them (``mlxcel.media.fetch``), before any decoder
has looked at them, and a prompt with its media expanded (``MediaPrompt``)."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

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


class MediaPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """A prompt with media, as a family's ``expand_media`` made it
    (``mlxcel.families.media``): the token ids with each item's placeholder expanded into
    the item's tokens, where each item's tokens are (``spans``: start and length, in item
    order), the items' ``digests`` (the blobs', or keyed with the options that change
    what the item becomes, such as Gemma 4's ``max_soft_tokens``: the vision cache and the
    prompt cache key on them), and ``inputs``, the family's own model
    inputs (NumPy arrays: pixel values, grid sizes), which core hands back to the family on
    the engine thread and never reads. ``grown``: per item, the placeholder's position in
    the unexpanded ids and how many tokens its expansion added, so that core can move the
    positions it found in them (``chat.cache_marks``)."""

    token_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    digests: tuple[bytes, ...]
    grown: tuple[tuple[int, int], ...]
    inputs: Any = None

    def digest_positions(self) -> tuple[tuple[int, bytes], ...]:
        """(position, digest) of each item, at its first token: what the prompt cache
        hashes with the blocks (``GenerationRequest.media_digests``), so that two prompts
        that differ only in an image share no block from that image on."""
        return tuple((start, digest)
                     for (start, _), digest in zip(self.spans, self.digests, strict=True))
