"""Loopback hosts for the media fetch policy's tests: recording HTTP servers (a private
canary, a simulated public origin) and the address guard's seams that make a public name
reach that origin.

The public host is simulated at the guard's two network seams
(``mlxcel.media.addresses.resolve`` and ``open_tcp``) and nowhere else, so every check
of the guard still runs and no test ever reaches a real network. Used in process by
core/tests/test_media_fetch.py and, through a ``sitecustomize``, inside a real server
by tests/test_e2e_vision.py.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpcore

from mlxcel.media import addresses


class RecordingHandler(http.server.BaseHTTPRequestHandler):
    """Records the path of every GET on its server, then answers it with ``route``.

    The base routes ``/to?u=URL`` to a redirect to URL and everything else to 404; a
    test's handler adds its own paths and calls ``super().route(url)`` for the rest.
    """

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status: int, body: bytes = b"", **headers: str) -> None:
        """Answer ``status`` with ``body``; ``Content_Type=`` is sent as Content-Type."""
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.server.hits.append(self.path)
        self.route(urlsplit(self.path))

    def route(self, url) -> None:
        if url.path == "/to":
            self.send(302, Location=parse_qs(url.query)["u"][0])
        else:
            self.send(404)


class Recorder(http.server.ThreadingHTTPServer):
    """An HTTP server on loopback, serving from a thread, that records in ``hits`` the
    path of every request it gets."""

    daemon_threads = True

    def __init__(self, handler: type[RecordingHandler], host: str = "127.0.0.1",
                 family: int = socket.AF_INET):
        self.address_family = family
        self.hits: list[str] = []
        super().__init__((host, 0), handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]


@contextlib.contextmanager
def loopback_hosts(handler: type[RecordingHandler]) -> Iterator[dict[str, Recorder | None]]:
    """``canary`` (the private target, 127.0.0.1), ``canary6`` (on ::1 where the machine
    has IPv6 loopback, else None) and ``origin`` (the simulated public host), each a
    ``Recorder`` answering with ``handler``; all shut down on exit."""
    made: dict[str, Recorder | None] = {"canary": Recorder(handler),
                                        "origin": Recorder(handler)}
    try:
        made["canary6"] = Recorder(handler, "::1", socket.AF_INET6)
    except OSError:
        made["canary6"] = None
    try:
        yield made
    finally:
        for server in made.values():
            if server is not None:
                server.shutdown()
                server.server_close()


class _Reported(httpcore.AsyncNetworkStream):
    """A real loopback stream that reports the simulated public peer."""

    def __init__(self, stream, peer):
        self._stream, self._peer = stream, peer

    async def read(self, max_bytes, timeout=None):
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer, timeout=None):
        await self._stream.write(buffer, timeout)

    async def aclose(self):
        await self._stream.aclose()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        raise RuntimeError("no TLS to the simulated origin")

    def get_extra_info(self, info):
        return self._peer if info == "server_addr" else self._stream.get_extra_info(info)


def public_host_seams(host: str, ip: str, origin_port: int,
                      dialed: list[tuple[str, int]] | None = None):
    """``(resolve, open_tcp)`` to stand for the guard's seams of the same names: ``host``
    resolves to the public ``ip``, and a dial to ``ip`` reaches ``origin_port`` on
    loopback while reporting ``ip`` as its peer; every other name resolves and dials
    through the seams in place now. Each dial's (address, port) is appended to
    ``dialed`` when given."""
    real_resolve, real_open = addresses.resolve, addresses.open_tcp

    async def resolve(name, port):
        if name.rstrip(".").lower() == host:
            return [addresses.ip_address(ip)]
        return await real_resolve(name, port)

    async def open_tcp(address, port, timeout):
        if dialed is not None:
            dialed.append((address, port))
        if address == ip:
            stream = await real_open("127.0.0.1", origin_port, timeout)
            return _Reported(stream, (ip, port))
        return await real_open(address, port, timeout)

    return resolve, open_tcp


def install_public_host(host: str, ip: str, origin_port: int) -> None:
    """Replace the guard's seams with ``public_host_seams`` for the rest of the process
    (a server's ``sitecustomize``; in process, a test patches them with monkeypatch)."""
    addresses.resolve, addresses.open_tcp = public_host_seams(host, ip, origin_port)
