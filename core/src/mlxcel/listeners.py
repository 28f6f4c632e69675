"""More than one listen address (``--host 127.0.0.1,::1``, as llama-server takes them).

Granian serves one listening socket per worker, and the server has one worker (it owns
the engine). So the first address is Granian's, and every other one is bound by the main
process, pre-fork, and relayed byte for byte to the first: each address accepts
connections, refuses to start when taken, and answers as the first one does. A relayed
request reaches the app from a loopback peer address; nothing in the app reads the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading

from mlxcel.errors import StartupError

CHUNK = 1 << 16
_WILDCARD_PEER = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def bind(address: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``address:port`` (no SO_REUSEPORT: a taken port refuses)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"port {port} is in use on {address}") from None
        raise StartupError(f"cannot listen on {address}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def target_of(address: str) -> str:
    """Where a relay connects for the first address (a wildcard: its loopback)."""
    return _WILDCARD_PEER.get(address, address)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()  # the slower side paces the faster one
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _relay(target: tuple[str, int], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


def start_relays(socks: list[socket.socket], target: tuple[str, int]) -> threading.Thread:
    """Relay every connection accepted on ``socks`` to ``target`` on a daemon thread's
    event loop (it ends with the process)."""

    async def main() -> None:
        for sock in socks:
            await asyncio.start_server(lambda r, w: _relay(target, r, w), sock=sock)
        await asyncio.Event().wait()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="mlxcel-relay",
                              daemon=True)
    thread.start()
    return thread
