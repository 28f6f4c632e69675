"""Clients that never read a token stream: each response may leave only a bounded number of
bytes unread (mlxcel.sendbuf caps the connection's send buffer), so the write timeout
(``--timeout``) cancels it and frees its slot long before the generation would end."""

from __future__ import annotations

import json
import socket
import time

import httpx
from conftest import assert_no_leak, rss_bytes

N_PREDICT = 6000
STREAMS = 2


def never_reading(base_url: str) -> socket.socket:
    """A streaming /completion sent on a socket that is never read from."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.connect((host, int(port)))
    body = json.dumps({"prompt": "go on", "n_predict": N_PREDICT, "ignore_eos": True,
                       "temperature": 0, "stream": True, "n_probs": 5}).encode()
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def test_streams_nobody_reads_free_their_slots(start_server):
    # the bound on tokens assumes one token per step: prompt lookup copies the random
    # model's loops several tokens a step, so it is off here
    srv = start_server("--parallel", str(STREAMS), "--timeout", "2", "--ctx-size", "16384",
                       "--prompt-lookup", "off")
    rss = rss_bytes(srv)
    before = httpx.get(srv.base_url + "/health").json()["observability"]["total_decode_tokens"]
    socks = [never_reading(srv.base_url) for _ in range(STREAMS)]
    try:
        t0 = time.monotonic()
        busy_seen = False
        while time.monotonic() - t0 < 40:
            batch = httpx.get(srv.base_url + "/health", timeout=5).json()["batch"]
            busy_seen |= batch["active_sequences"] > 0
            if busy_seen and batch["active_sequences"] == 0:
                break
            time.sleep(0.1)
        freed = time.monotonic() - t0
        after = httpx.get(srv.base_url + "/health").json()["observability"]
        generated = after["total_decode_tokens"] - before
        # unbounded, both run to their end (~14 s here); bounded, ~2 s of tokens and --timeout
        assert busy_seen and generated < STREAMS * N_PREDICT / 2, (freed, generated)
    finally:
        for sock in socks:
            sock.close()
    assert_no_leak(srv, rss)
