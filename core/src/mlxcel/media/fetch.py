"""Core's fetch of a media part's source into a ``MediaBlob``, under the spec's policy.

A source is a ``data:`` URI (base64 or percent-encoded), an ``http(s)://`` URL, a
``file://`` URL or a bare absolute path; Anthropic's base64 sources come through
``blob_from_base64``. Every source is the caller's, and the API key authenticates the
caller without sandboxing what the server then reads, so:

- a remote URL is fetched only from public addresses, checked before connecting, on the
  connected peer and on every redirect (at most ``max_redirects``), by
  ``mlxcel.media.addresses``; ``MLXCEL_ALLOW_PRIVATE_MEDIA_URLS=1`` lifts that check;
- a local file is read only under a ``--media-path`` root once symlinks are resolved, and
  none at all without one; ``..`` and relative paths are refused;
- no source may exceed ``--max-image-payload-size`` (refused as soon as it shows:
  Content-Length, then while streaming) or take longer than ``timeout_s`` in all.

Inline sources (``data:`` URIs, base64) of ``INLINE_MEMO_MIN`` characters or more are
memoized by their exact text (``mlxcel.media.recent``): agents re-send every image of the
conversation on every turn, and decoding a screenshot's base64 and hashing its bytes
costs milliseconds each time, where finding the same text again costs one string hash.
A refusal is never memoized, so the policy is applied to every text that is not a
repeat of one that passed it.

A refusal is ``InvalidRequest`` (400) naming the part (``messages[0].content[1]``) and the
reason in general terms; it never echoes an address, a path or the bytes read. It is no
hostname allow-list and no HTTPS-only rule: restricting callers and enforcing egress and
filesystem policy outside mlxcel stays the operator's job.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import os
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import httpx
import msgspec

from mlxcel.errors import InvalidRequest
from mlxcel.media.addresses import GuardedTransport, Refused
from mlxcel.media.recent import Recent
from mlxcel.types.media import MediaBlob

_MIME = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_OCTETS = "application/octet-stream"
OUTSIDE = "the file is outside the allowed media paths"
INLINE_MEMO_MIN = 64 * 1024  # characters of inline source worth memoizing
INLINE_MEMO_ITEMS = 32
INLINE_MEMO_BYTES = 256 << 20  # the texts kept as keys and their decoded bytes

# inline sources by their text (module docstring): (blob, the key's length)
_inline: Recent[tuple[MediaBlob, int]] = Recent(
    INLINE_MEMO_ITEMS, INLINE_MEMO_BYTES, lambda kept: len(kept[0].data) + kept[1])


class FetchPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What a fetch may reach and how much it may take. ``media_paths`` are the
    ``--media-path`` roots, resolved (no symlink left in them)."""

    media_paths: tuple[Path, ...] = ()
    allow_private: bool = False  # MLXCEL_ALLOW_PRIVATE_MEDIA_URLS
    max_bytes: int = 64 << 20  # --max-image-payload-size
    timeout_s: float = 10.0  # the whole fetch, redirects included
    max_redirects: int = 5

    @classmethod
    def from_settings(cls, settings: Any) -> FetchPolicy:
        """The policy ``Settings`` give: ``--media-path``,
        ``MLXCEL_ALLOW_PRIVATE_MEDIA_URLS`` and ``--max-image-payload-size``."""
        return cls(media_paths=tuple(Path(p).resolve() for p in settings.media_path),
                   allow_private=settings.allow_private_media_urls,
                   max_bytes=settings.max_image_payload_size)


def _too_large(max_bytes: int) -> Refused:
    return Refused(f"the media is larger than --max-image-payload-size ({max_bytes} bytes)")


def _mime(raw: str | None) -> str:
    """A declared MIME type without its parameters, lower-cased; anything that is not
    ``type/subtype`` is ``application/octet-stream`` (the decoder sniffs the bytes)."""
    value = (raw or "").split(";", 1)[0].strip().lower()
    return value if _MIME.match(value) else _OCTETS


def _refusal(part: str, exc: Refused) -> InvalidRequest:
    return InvalidRequest(f"{part}: {exc.reason}", param=part)


async def fetch(source: str, policy: FetchPolicy, part: str) -> MediaBlob:
    """The blob ``source`` names, under ``policy``; ``part`` is the JSON path of the
    content part, named by every refusal (``InvalidRequest``)."""
    try:
        scheme = source[:source.find(":") + 1].lower() if ":" in source[:8] else ""
        if scheme == "data:":
            return _memoized(source, policy.max_bytes,
                             lambda: MediaBlob.of(*_from_data_uri(source, policy.max_bytes),
                                                  "data"))
        if scheme in ("http:", "https:"):
            data, mime = await _within(policy, _fetch_remote(source, policy))
            return MediaBlob.of(data, mime, "http")
        if scheme == "file:":
            path = _file_url_path(source)
        elif source.startswith("/"):
            path = source
        elif scheme:
            raise Refused("a media source must be a data: URI, an http(s):// or file:// "
                          "URL, or an absolute path")
        else:
            raise Refused("a relative path is refused: give an absolute path under "
                          "--media-path")
        data, mime = await _within(policy, asyncio.to_thread(_read_local, path, policy))
        return MediaBlob.of(data, mime, "file")
    except Refused as exc:
        raise _refusal(part, exc) from None


def blob_from_base64(data: str, mime: str, part: str, *,
                     max_bytes: int | None = None) -> MediaBlob:
    """A blob from raw base64 with its declared MIME type (Anthropic's ``base64``
    source); more than ``max_bytes`` decoded bytes is refused."""
    try:
        return _memoized(data, max_bytes,
                         lambda: MediaBlob.of(_b64decode(data, max_bytes), _mime(mime), "data"),
                         mime)
    except Refused as exc:
        raise _refusal(part, exc) from None


def _memoized(text: str, max_bytes: int | None, make: Any, *key: str) -> MediaBlob:
    """``make()``'s blob for an inline source, from the memo when ``text`` (with the
    limit and ``key``) was seen lately (module docstring)."""
    if len(text) < INLINE_MEMO_MIN:
        return make()
    return _inline.get((text, max_bytes, *key), lambda: (make(), len(text)))[0]


async def _within(policy: FetchPolicy, work: Any) -> tuple[bytes, str]:
    try:
        return await asyncio.wait_for(work, policy.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        raise Refused(f"fetching the media took longer than {policy.timeout_s:g} s") from None


# --- data: URIs and base64 ------------------------------------------------------------------


def _b64decode(text: str, max_bytes: int | None) -> bytes:
    """Standard base64, whitespace ignored and missing padding tolerated; the size is
    checked before decoding, so an oversized payload costs no decode."""
    compact = "".join(text.split())
    if "%" in compact:  # RFC 2397 lets the data be percent-encoded; base64 has no '%'
        compact = unquote(compact)
    if max_bytes is not None and len(compact) * 3 // 4 > max_bytes + 2:
        raise _too_large(max_bytes)
    compact += "=" * (-len(compact) % 4)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("the base64 data is not valid") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise _too_large(max_bytes)
    return data


def _from_data_uri(uri: str, max_bytes: int) -> tuple[bytes, str]:
    """``data:[<mime>][;param=value]*[;base64],<data>`` (RFC 2397); no MIME type means
    ``text/plain``, as the RFC says."""
    header, comma, payload = uri[5:].partition(",")
    if not comma:
        raise Refused("the data: URI has no ',' before its data")
    params = [p.strip() for p in header.split(";")]
    mime = _mime(params[0]) if params[0] else "text/plain"
    if len(params) > 1 and params[-1].lower() == "base64":
        return _b64decode(payload, max_bytes), mime
    if len(payload) > 3 * max_bytes:  # percent-encoding at most triples the length
        raise _too_large(max_bytes)
    data = unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise _too_large(max_bytes)
    return data, mime


# --- local files ------------------------------------------------------------------------


def _file_url_path(url: str) -> str:
    """The path of a ``file://`` URL: no host but ``localhost``, no query."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query:
        raise Refused("a file:// URL must be file:///absolute/path")
    return unquote(parts.path)


def _within_roots(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _read_local(raw: str, policy: FetchPolicy) -> tuple[bytes, str]:
    """The bytes of a file under a root, read through a descriptor opened on the
    symlink-free path that was checked (``O_NOFOLLOW``); a FIFO, a device or a directory
    is refused before a byte is read."""
    if not policy.media_paths:
        raise Refused("local files are refused: the server has no --media-path")
    path = Path(raw)
    if not path.is_absolute():
        raise Refused("a relative path is refused: give an absolute path under --media-path")
    if ".." in path.parts:
        raise Refused("'..' in a media path is refused")
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError):
        raise Refused(OUTSIDE) from None
    if not _within_roots(real, tuple(root.resolve() for root in policy.media_paths)):
        raise Refused(OUTSIDE)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        raise Refused("the file does not exist or cannot be read") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Refused("the path is not a regular file")
        if info.st_size > policy.max_bytes:
            raise _too_large(policy.max_bytes)
        data = file.read(policy.max_bytes + 1)
    if len(data) > policy.max_bytes:
        raise _too_large(policy.max_bytes)
    return data, _mime(mimetypes.guess_type(real.name)[0])


# --- remote URLs ------------------------------------------------------------------------


async def _fetch_remote(url: str, policy: FetchPolicy) -> tuple[bytes, str]:
    """GET ``url``, following at most ``max_redirects`` redirects by hand: each hop's
    connection opens through the address guard, and a hop to anything but http(s) is
    refused. A fresh client per fetch: no cookie or connection outlives it."""
    client = httpx.AsyncClient(
        transport=GuardedTransport(policy.allow_private), trust_env=False,
        follow_redirects=False, timeout=policy.timeout_s,
        headers={"Accept-Encoding": "identity", "User-Agent": "mlxcel"})
    async with client:
        try:
            request = client.build_request("GET", url)
        except httpx.InvalidURL:
            raise Refused("the URL is not valid") from None
        if not request.url.host:
            raise Refused("the URL is not valid")
        for _ in range(policy.max_redirects + 1):
            if request.url.scheme not in ("http", "https"):
                raise Refused("a redirect leads to a URL that is not http(s)")
            response = await _send(client, request)
            try:
                if response.next_request is None:
                    return await _read_body(response, policy.max_bytes)
                request = response.next_request
            finally:
                await response.aclose()
    raise Refused(f"the URL redirects more than {policy.max_redirects} times")


async def _send(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    try:
        return await client.send(request, stream=True)
    except httpx.TimeoutException:
        raise
    except (httpx.InvalidURL, httpx.RemoteProtocolError):
        raise Refused("the server's answer (or its redirect) is not valid HTTP") from None
    except httpx.HTTPError:
        raise Refused("the URL's host could not be reached") from None


async def _read_body(response: httpx.Response, max_bytes: int) -> tuple[bytes, str]:
    """A 2xx body, at most ``max_bytes``: a Content-Length over it is refused before
    reading, and reading stops at the first chunk past it. A compressed body is refused
    (identity was asked for; a decompressed size is no bound on a compressed one)."""
    if not 200 <= response.status_code < 300:
        raise Refused(f"the URL answered HTTP {response.status_code}")
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        raise Refused("the server sent a compressed body (Content-Encoding)")
    length = response.headers.get("content-length", "")
    if length.strip().isdigit() and int(length) > max_bytes:
        raise _too_large(max_bytes)
    data = bytearray()
    try:
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) > max_bytes:
                raise _too_large(max_bytes)
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError:
        raise Refused("the connection broke while reading the media") from None
    return bytes(data), _mime(response.headers.get("content-type"))
