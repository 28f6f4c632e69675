"""Connection faults: idle-socket floods are closed by --idle-timeout while /health still
answers, and a second server on a port in use refuses to start."""

from __future__ import annotations

import resource
import selectors
import socket
import subprocess
import time

import httpx
from conftest import assert_no_leak, rss_bytes
from mlxcel.testing.servers import server_exe

SILENT, PARTIAL, KEPT_ALIVE = 1100, 50, 50  # sockets per kind
IDLE_TIMEOUT = 3.0
HEALTH_DEADLINE = 1.0  # seconds /health may take while the flood is open
CLOSE_GRACE = 4.0  # seconds past the idle timeout the server may take to close them


def ensure_fd_limit(count: int) -> None:
    """This test process needs one descriptor per socket it opens."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count, hard), hard))


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def kept_alive(port: int) -> socket.socket:
    """A connection that has had one complete request and response, then idles."""
    sock = connect(port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def wait_closed(socks: list[socket.socket], deadline: float) -> list[float]:
    """Read every socket until EOF (b''); returns when each one closed (time.time())."""
    sel = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    closed: list[float] = []
    while len(closed) < len(socks) and time.time() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.time())):
            try:
                data = key.fileobj.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:  # anything before EOF (a 408 for partial headers) is fine
                sel.unregister(key.fileobj)
                closed.append(time.time())
    sel.close()
    return closed


def health_seconds(base_url: str) -> float:
    start = time.perf_counter()
    assert httpx.get(base_url + "/health", timeout=10).status_code == 200
    return time.perf_counter() - start


def test_an_idle_socket_flood_is_closed_and_health_still_answers(start_server):
    ensure_fd_limit(SILENT + PARTIAL + KEPT_ALIVE + 256)
    server = start_server("--idle-timeout", str(IDLE_TIMEOUT))
    rss_before = rss_bytes(server)
    opened = time.time()
    socks = [connect(server.port) for _ in range(SILENT)]
    for _ in range(PARTIAL):
        socks.append(connect(server.port))
        socks[-1].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Partial: ")
    socks += [kept_alive(server.port) for _ in range(KEPT_ALIVE)]
    last_opened = time.time()
    try:
        latencies = [health_seconds(server.base_url) for _ in range(5)]
        assert max(latencies) < HEALTH_DEADLINE, latencies
        closed = wait_closed(socks, last_opened + IDLE_TIMEOUT + CLOSE_GRACE)
        assert len(closed) == len(socks), f"{len(socks) - len(closed)} sockets still open"
        assert min(closed) - opened > IDLE_TIMEOUT * 0.5  # closed by the timeout, not at once
        print(f"opened {len(socks)} in {last_opened - opened:.2f}s; /health max "
              f"{max(latencies) * 1000:.0f} ms; first closed after {min(closed) - opened:.2f}s, "
              f"last {max(closed) - last_opened:.2f}s after the last was opened")
    finally:
        for sock in socks:
            sock.close()
    assert health_seconds(server.base_url) < HEALTH_DEADLINE
    assert_no_leak(server, rss_before)


def test_a_second_server_on_a_port_in_use_exits_2_and_the_first_serves(start_server,
                                                                      tiny_checkpoint):
    server = start_server()
    rss_before = rss_bytes(server)
    started = time.time()
    proc = subprocess.run([server_exe(), "--model", str(tiny_checkpoint),
                           "--port", str(server.port)],
                          capture_output=True, text=True, timeout=60)
    assert time.time() - started < 30
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"port {server.port} is in use" in lines[0]
    for _ in range(20):  # every request reaches the first server (no shared port)
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    assert_no_leak(server, rss_before)
