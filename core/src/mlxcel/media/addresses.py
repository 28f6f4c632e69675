"""Which addresses a remote media URL may reach, and the connections that keep to them.

A media URL comes from the caller, so without a rule the server would fetch what only it
can reach: its loopback, its LAN, a cloud metadata service. ``GuardedBackend`` is the
httpcore network backend of every media fetch. For each new connection it resolves the
name itself, refuses if any address it resolves to is not public, dials only the
addresses it checked (a second resolution is what DNS rebinding answers differently), and
checks the connected peer once more. Redirects open their connections through it too.
TLS still verifies the URL's host name: httpcore wraps the stream with it as SNI.
``GuardedTransport`` puts it under an httpx client (httpx's own transport takes no
network backend). Only ``resolve`` and ``open_tcp`` touch the network: the tests' seams.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any

import httpcore
import httpx

IPAddress = IPv4Address | IPv6Address

NON_PUBLIC = "the URL resolves to a non-public address"

_V4_BLOCKED = tuple(ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
    "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4"))
_V6_BLOCKED = tuple(ip_network(n) for n in (
    "::/96", "::ffff:0:0/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
    "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8"))
_NAT64 = ip_network("64:ff9b::/96")  # the well-known prefix: an IPv4 address inside


class Refused(Exception):
    """A media source the policy refuses; ``reason`` is the user-facing text, which names
    no address, path or content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _inner_v4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, where packets to it reach that IPv4
    host: mapped (``::ffff:a.b.c.d``), compatible (``::a.b.c.d``) and NAT64."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1):
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address on the public internet: not loopback, private,
    link-local (the metadata address 169.254.169.254 among them), unique-local,
    unspecified, multicast, shared (100.64/10), documentation or reserved, and not an
    IPv6 form that carries such an IPv4 address (mapped, compatible, NAT64, 6to4,
    Teredo). ``ipaddress``'s ``is_global`` is the base; the ranges are listed too, since
    older Pythons call some of them global."""
    if isinstance(ip, IPv6Address):
        inner = _inner_v4(ip)
        if inner is not None:
            return is_public(inner)
        carried = [ip.sixtofour, *(ip.teredo or ())]
        if any(v4 is not None and not is_public(v4) for v4 in carried):
            return False
        blocked: Iterable[Any] = _V6_BLOCKED
    else:
        blocked = _V4_BLOCKED
    if not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_loopback \
            or ip.is_link_local or ip.is_unspecified:
        return False
    return not any(ip in net for net in blocked)


def local_name(host: str) -> bool:
    """``localhost`` and its subdomains (RFC 6761): refused without asking the resolver,
    which may answer anything for them."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (an IP literal, or a numeric form such as
    ``2130706433``: the address it denotes), in the resolver's order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ip_address(info[4][0]) for info in infos))


_DIAL = httpcore.AnyIOBackend()


async def open_tcp(ip: str, port: int, timeout: float | None) -> httpcore.AsyncNetworkStream:
    """A TCP connection to the address ``ip`` itself (the one seam tests replace)."""
    return await _DIAL.connect_tcp(ip, port, timeout=timeout)


def _peer(stream: httpcore.AsyncNetworkStream) -> IPAddress | None:
    addr = stream.get_extra_info("server_addr")
    try:
        peer = ip_address(addr[0])
    except (TypeError, ValueError, IndexError):
        return None
    return peer.ipv4_mapped or peer if isinstance(peer, IPv6Address) else peer


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's backend for media fetches: resolve, check, dial the checked address,
    check the peer (module docstring). ``allow_private`` lifts the address checks."""

    def __init__(self, allow_private: bool = False) -> None:
        self.allow_private = allow_private

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        if not self.allow_private and local_name(host):
            raise Refused(NON_PUBLIC)
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError, ValueError):
            raise Refused("the URL's host name does not resolve") from None
        if not addresses:
            raise Refused("the URL's host name does not resolve")
        if not self.allow_private and not all(is_public(ip) for ip in addresses):
            raise Refused(NON_PUBLIC)
        failure: Exception | None = None
        for ip in addresses:
            try:
                stream = await open_tcp(str(ip), port, timeout)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            await self._check_peer(stream, ip)
            return stream
        raise failure or Refused("the URL's host could not be reached")

    async def _check_peer(self, stream: httpcore.AsyncNetworkStream, dialed: IPAddress) -> None:
        """The connected peer is the address dialed, and public: else the connection is
        closed before a byte of the request is sent."""
        if self.allow_private:
            return
        peer = _peer(stream)
        want = dialed.ipv4_mapped or dialed if isinstance(dialed, IPv6Address) else dialed
        if peer is None or peer != want or not is_public(peer):
            await stream.aclose()
            raise Refused(NON_PUBLIC)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        raise Refused("the URL names a local socket")

    async def sleep(self, seconds: float) -> None:
        await _DIAL.sleep(seconds)


_CORE_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.PoolTimeout,
                httpcore.UnsupportedProtocol)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> Any:
        try:
            async for chunk in self._stream:
                yield chunk
        except httpcore.TimeoutException as exc:
            raise httpx.ReadTimeout(str(exc)) from None
        except _CORE_ERRORS as exc:
            raise httpx.ReadError(str(exc)) from None

    async def aclose(self) -> None:
        await self._stream.aclose()


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs), built once: building it costs tens
    of milliseconds, and a client context is shared safely."""
    return httpx.create_ssl_context()


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore pool whose connections open through
    ``GuardedBackend`` (httpx's own transport takes no network backend), with no proxy:
    a proxy would make the connection's peer the proxy, not the media host."""

    def __init__(self, allow_private: bool = False) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_tls(), retries=0,
            network_backend=GuardedBackend(allow_private))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host,
                           port=request.url.port, target=request.url.raw_path)
        core = httpcore.Request(method=request.method, url=url, headers=request.headers.raw,
                                content=request.stream, extensions=request.extensions)
        try:
            response = await self._pool.handle_async_request(core)
        except httpcore.TimeoutException as exc:
            raise httpx.ConnectTimeout(str(exc), request=request) from None
        except _CORE_ERRORS as exc:
            raise httpx.ConnectError(str(exc), request=request) from None
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_Body(response.stream), extensions=response.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()
