"""Fast detection of a dead peer: one idle TCP connection from each follower to rank 0.

A collective whose peer died may wait for it rather than fail (a rank killed inside a
decode step leaves the ring backend's survivor waiting), and the watchdog only fires after
``--distributed-timeout``. A process that dies, however it dies, has its sockets closed
by the system: so each follower keeps one connection to rank 0 open and silent, each side
blocks reading it on a thread of its own, and end of file means the other process is
gone. Rank 0 then fails the engine at once; a follower exits. Nothing but the start-up
token ever travels on it; a rank that hangs keeps it open (the watchdog's case).

Rank 0 listens on every interface and sends its port, a token and the addresses its
peers may know it by (what the launcher gave them for rank 0, then its host's own) in the
start-up agreement; a follower connects to the first that answers with the token.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Callable

import structlog

from mlxcel.backend import library_env
from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.distributed")
CONNECT_S = 3.0  # per address a follower tries
ACCEPT_S = 60.0  # rank 0 waits this long for every follower to connect


def rank0_addresses() -> list[str]:
    """Addresses rank 0 may be reached at: the launcher's (ring hostfile, JACCL
    coordinator, NCCL host), then this host's own, then loopback (ranks on one host)."""
    env = library_env()
    out: list[str] = []
    try:
        with open(env.get("MLX_HOSTFILE", ""), encoding="utf-8") as fh:
            out += [a.rsplit(":", 1)[0] for a in json.load(fh)[0]]
    except (OSError, ValueError, IndexError, TypeError):
        pass
    for name in ("MLX_JACCL_COORDINATOR", "NCCL_HOST_IP"):
        if env.get(name):
            out.append(env[name].rsplit(":", 1)[0] if ":" in env[name] else env[name])
    try:
        out += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return list(dict.fromkeys([*out, "127.0.0.1"]))


def _watch(conn: socket.socket, on_gone: Callable[[], None], name: str) -> None:
    def run() -> None:
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        on_gone()

    threading.Thread(target=run, name=name, daemon=True).start()


class Listener:
    """Rank 0's side: accepts one connection per follower, then watches them."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.sock = socket.create_server(("", 0), family=socket.AF_INET, backlog=64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stopping = False

    def accept(self, followers: int, on_gone: Callable[[int], None]) -> None:
        """Wait for every follower (``ACCEPT_S``); ``on_gone(rank)`` when one's ends."""
        self.sock.settimeout(ACCEPT_S)
        while len(self.conns) < followers:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                raise StartupError(f"only {len(self.conns)} of {followers} follower ranks "
                                   f"reached rank 0's liveness port {self.port} in "
                                   f"{ACCEPT_S:g} s (a firewall between the hosts?)") from None
            conn.settimeout(CONNECT_S)
            try:
                hello = conn.recv(64).decode(errors="replace").split()
            except OSError:
                conn.close()
                continue
            if len(hello) != 2 or hello[0] != self.token or not hello[1].isdigit():
                conn.close()
                continue
            conn.sendall(b"ok")
            conn.settimeout(None)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self.conns.append(conn)
            rank = int(hello[1])
            _watch(conn, lambda r=rank: self.stopping or on_gone(r), f"mlxcel-live-{rank}")
        self.sock.close()

    def close(self) -> None:
        self.stopping = True
        for conn in self.conns:
            conn.close()


def connect(hosts: list[str], port: int, token: str, rank: int,
            on_gone: Callable[[], None]) -> str:
    """A follower's side: connect to rank 0 (the first of ``hosts`` that answers) and
    call ``on_gone()`` when that connection ends; the address that answered."""
    for host in hosts:
        try:
            conn = socket.create_connection((host, port), timeout=CONNECT_S)
        except OSError:
            continue
        try:
            conn.sendall(f"{token} {rank}".encode())
            answered = conn.recv(2) == b"ok"  # rank 0, not another program on that port
        except OSError:
            answered = False
        if not answered:
            conn.close()
            continue
        conn.settimeout(None)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        _watch(conn, on_gone, "mlxcel-live-rank0")
        return host
    raise StartupError(f"rank {rank} cannot reach rank 0's liveness port {port} at any of "
                       f"{', '.join(hosts)}")
