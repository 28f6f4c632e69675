"""CORS as llama-server answers it: every ``OPTIONS`` request is a preflight, answered 200
with the CORS headers and no API key asked (browsers send none on a preflight), and every
response, errors included, names the allowed ``Origin``.

An origin that is not allowed gets the same answer without any CORS header (a preflight
is still 200, never 403): the browser then refuses to hand the answer to the page, as it
does with llama-server. ``localhost`` in the list means every loopback origin on any port
(``http://localhost:3000``, ``http://127.0.0.1``, ``http://[::1]:3000``).

The middleware applies this at the edge, before the key check and around every response,
rather than Litestar's ``CORSConfig``: that one sits inside the app, so a preflight would
meet the key check first, an edge rejection (401, 403, 415) would carry no CORS headers,
and its preflight answers 204. The Host guard (``mlxcel.http_guard``) still runs first;
the hosts of origins listed here are accepted by it too.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

from mlxcel.http_guard import LOOPBACK_NAMES

ANY = "*"
LOCALHOST = "localhost"  # llama-server's special value: loopback origins only
EXPOSED = b"x-request-id"


def _origin_host(origin: str) -> str | None:
    try:
        return urlsplit(origin.strip()).hostname
    except ValueError:
        return None


def _normal(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def _names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


class CorsPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """``origins``: ``*`` (any), ``localhost`` (loopback origins, the default: a page on
    another site gets no CORS answer unless named) and exact origins
    (``scheme://host[:port]``); ``methods`` and ``headers`` as the preflight answers them
    (``*`` headers: the ones the preflight asks for, since a literal ``*`` does not
    cover ``Authorization`` and means nothing with credentials)."""

    origins: tuple[str, ...] = (LOCALHOST,)
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = ANY
    credentials: bool = True

    @classmethod
    def from_flags(cls, origins: str, methods: str, headers: str,
                   credentials: bool) -> CorsPolicy:
        return cls(origins=tuple(_normal(o) if o not in (ANY, LOCALHOST) else o
                                 for o in _names(origins)) or (LOCALHOST,),
                   methods=", ".join(m.upper() for m in _names(methods)),
                   headers=", ".join(_names(headers)) or ANY, credentials=credentials)

    def allows(self, origin: str) -> bool:
        """``Origin: null`` (sandboxed frames, ``file:`` pages, redirects) is never allowed:
        any page can send it, so echoing it with credentials would admit every page."""
        if _normal(origin) == "null":
            return False
        if ANY in self.origins or _normal(origin) in self.origins:
            return True
        return LOCALHOST in self.origins and _origin_host(origin) in LOOPBACK_NAMES

    def origin_hosts(self) -> frozenset[str]:
        """The host names of the exact origins listed: the Host guard admits them."""
        hosts = (_origin_host(o) for o in self.origins if o not in (ANY, LOCALHOST))
        return frozenset(h for h in hosts if h)

    def response_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """What every response to ``origin`` carries (none for an origin not allowed, or a
        request without one). The origin is echoed, never ``*``, so credentials work."""
        if not origin or not self.allows(origin):
            return []
        out = [(b"access-control-allow-origin", origin.strip().encode("latin-1")),
               (b"vary", b"Origin"), (b"access-control-expose-headers", EXPOSED)]
        if self.credentials:
            out.append((b"access-control-allow-credentials", b"true"))
        return out

    def preflight_headers(self, origin: str | None,
                          requested: str | None) -> list[tuple[bytes, bytes]]:
        """A preflight's extra headers: the methods, and the headers it may send."""
        if not origin or not self.allows(origin):
            return []
        allowed = requested if self.headers == ANY else self.headers
        out = [(b"access-control-allow-methods", self.methods.encode())]
        if allowed:
            out.append((b"access-control-allow-headers", allowed.strip().encode("latin-1")))
        return out
