"""A bound on the bytes a streaming response may leave unread: its connection's kernel send
buffer is capped at ``STREAM_SNDBUF`` bytes.

ASGI cannot tell what a client has read, only when a send blocks; and a send blocks only
once the kernel's buffers are full. Linux grows a connection's send buffer up to
``net.ipv4.tcp_wmem``'s maximum (4 MiB by default), so a client that never reads a token
stream held its slot until megabytes had been generated for nobody, and the write timeout
(``--timeout``) started counting only then. Capping the send buffer (which also stops its
autotuning) makes the send block after about that many unread bytes plus the client's own
receive buffer, and the write timeout then cancels the response and frees its slot.

Granian owns the sockets and offers no socket options, so the connection's descriptor is
found by its addresses among this process's sockets (``/proc/self/fd`` on Linux,
``/dev/fd`` on macOS); a socket not found is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from typing import Any

STREAM_SNDBUF = 64 << 10  # bytes; the kernel doubles it for its bookkeeping
_FD_DIRS = ("/proc/self/fd", "/dev/fd")


def _fds() -> list[int]:
    for path in _FD_DIRS:
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(path) if name.isdigit()]
    return []


def _addresses(fd: int) -> tuple[Any, Any] | None:
    """(peer, local) of socket ``fd`` (through a duplicate, so ``fd`` stays as it is)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    with sock:
        try:
            return sock.getpeername(), sock.getsockname()
        except OSError:
            return None


def _same(address: Any, host: Any, port: Any) -> bool:
    """Whether a socket address is ``host:port`` (Granian's scope gives the port as text)."""
    if not isinstance(address, tuple) or len(address) < 2 or str(address[1]) != str(port):
        return False
    name, host = str(address[0]), str(host)
    return name == host or name.removeprefix("::ffff:") == host.removeprefix("::ffff:")


def connection_fd(client: Any, server: Any) -> int | None:
    """The descriptor of the TCP connection from ``client`` to ``server`` (ASGI's
    ``(host, port)`` pairs), or None."""
    if not client or not server or len(client) < 2 or len(server) < 2:
        return None
    for fd in _fds():
        found = _addresses(fd)
        if found and _same(found[0], *client[:2]) and _same(found[1], *server[:2]):
            return fd
    return None


def bound_unread(scope: dict, limit: int = STREAM_SNDBUF) -> bool:
    """Cap the send buffer of ``scope``'s connection at ``limit`` bytes; whether it was
    found and set."""
    fd = connection_fd(scope.get("client"), scope.get("server"))
    if fd is None:
        return False
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit)  # locks it too
    except OSError:
        return False
    return True
