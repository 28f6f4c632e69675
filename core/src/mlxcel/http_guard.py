"""Edge rules checked before routing: request ids, Host/Origin names, POST content types.

Pure functions over header values, so the middleware stays a thin ASGI wrapper and each
rule can be read (and tested) on its own.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import msgspec

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
LOOPBACK_BINDS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
REQUEST_ID_MAX = 128
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % REQUEST_ID_MAX)
# what a browser may POST cross-site without a CORS preflight
_SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded",
                           "multipart/form-data"})
_CURL_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded"})


class HostPolicy(msgspec.Struct, frozen=True):
    """Which Host/Origin names are accepted; ``names is None`` means any."""

    names: frozenset[str] | None

    @classmethod
    def from_settings(cls, host: str, allowed_hosts: str | None,
                      listening: bool = True) -> HostPolicy:
        """A listener on a loopback bind accepts only loopback names (DNS-rebinding guard);
        ``--allowed-hosts`` adds names (and turns the check on for any bind, and for an app
        that is not listening); ``*`` turns it off."""
        listed = [n.strip().lower() for n in (allowed_hosts or "").split(",") if n.strip()]
        if "*" in listed:
            return cls(None)
        if not listed and not (listening and host.lower() in LOOPBACK_BINDS):
            return cls(None)
        return cls(LOOPBACK_NAMES | {_strip_port(n) for n in listed})

    def denial(self, host: str | None, origin: str | None) -> str | None:
        """None when allowed, else the user-facing reason (names only, never a payload)."""
        if self.names is None:
            return None
        if host is not None and _strip_port(host.strip().lower()) not in self.names:
            return "Host not allowed; start the server with --allowed-hosts to accept it"
        if origin is not None and _origin_name(origin) not in self.names:
            return "Origin not allowed; start the server with --allowed-hosts to accept it"
        return None


def _strip_port(value: str) -> str:
    """``name[:port]`` or ``[v6][:port]`` -> the bare name (brackets dropped)."""
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _origin_name(origin: str) -> str | None:
    """The host of an Origin header (``null`` and garbage have none)."""
    try:
        return urlsplit(origin.strip()).hostname
    except ValueError:
        return None


def request_id(raw: bytes | None) -> str | None:
    """The client's ``x-request-id`` when it is 1-128 visible ASCII characters, else None:
    a value that is echoed into headers and logs must not carry control bytes or bulk."""
    if raw is not None and _REQUEST_ID.fullmatch(raw):
        return raw.decode("ascii")
    return None


def media_type(content_type: str | None) -> str | None:
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip().lower() or None


def is_json(mtype: str) -> bool:
    return mtype == "application/json" or mtype.endswith("+json")


UPLOAD_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations",
                          "/audio/transcriptions", "/audio/translations"})


def content_type_denial(content_type: str | None, from_browser: bool,
                        path: str = "") -> str | None:
    """None when a POST body may be read as JSON, else the 415 message.

    JSON types and a missing type pass. ``text/plain`` and form-urlencoded pass only from
    non-browser clients (``curl -d`` sends form-urlencoded); from a browser they are the
    cross-site "simple request" types that skip CORS preflight, so they are refused.
    ``multipart/form-data`` passes on the upload routes (``UPLOAD_PATHS``: the OpenAI SDK
    uploads audio so) from non-browser clients, and is refused everywhere else.
    """
    mtype = media_type(content_type)
    if mtype is None or is_json(mtype):
        return None
    if mtype == "multipart/form-data" and path in UPLOAD_PATHS and not from_browser:
        return None
    if mtype in _CURL_TYPES and not from_browser:
        return None
    if mtype in _SIMPLE_TYPES:
        return "Unsupported Content-Type from a browser form; send application/json"
    return "Unsupported Content-Type; send the body as application/json"
