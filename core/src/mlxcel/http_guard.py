"""Edge rules checked before routing: request ids, Host names, POST content types.

Pure functions over header values, so the middleware stays a thin ASGI wrapper and each
rule can be read (and tested) on its own.
"""

from __future__ import annotations

import re

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
    """Which ``Host`` names are accepted; ``names is None`` means any.

    Only the Host header is checked (the DNS-rebinding guard: a page on a name that
    resolves to this machine sends its own name as Host). The ``Origin`` is CORS's
    business (``mlxcel.cors``): as llama-server answers, a foreign origin gets its answer
    without CORS headers, which the browser then refuses to hand to the page."""

    names: frozenset[str] | None

    @classmethod
    def from_settings(cls, host: str, allowed_hosts: str | None,
                      listening: bool = True) -> HostPolicy:
        """A listener whose every bind (``--host a,b``) is loopback accepts only loopback
        names (DNS-rebinding guard); ``--allowed-hosts`` adds names (and turns the check on
        for any bind, and for an app that is not listening); ``*`` turns it off."""
        listed = [n.strip().lower() for n in (allowed_hosts or "").split(",") if n.strip()]
        if "*" in listed:
            return cls(None)
        binds = [b.strip().lower() for b in host.split(",") if b.strip()]
        loopback = bool(binds) and all(b in LOOPBACK_BINDS for b in binds)
        if not listed and not (listening and loopback):
            return cls(None)
        return cls(LOOPBACK_NAMES | {_strip_port(n) for n in listed})

    def denial(self, host: str | None) -> str | None:
        """None when allowed, else the user-facing reason (names only, never a payload)."""
        if self.names is None:
            return None
        if host is not None and _strip_port(host.strip().lower()) not in self.names:
            return "Host not allowed; start the server with --allowed-hosts to accept it"
        return None


def _strip_port(value: str) -> str:
    """``name[:port]`` or ``[v6][:port]`` -> the bare name (brackets dropped)."""
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


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
