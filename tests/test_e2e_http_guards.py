"""End to end on the real mlxcel-server: write timeout (a client that stops reading frees
its slot), body timeout (408), Host check, HEAD, and the edge on unknown routes."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
API_KEY = "k-guards-e2e"
KEY = {"Authorization": f"Bearer {API_KEY}"}
# top_logprobs makes each frame ~2 KB, so the socket buffers fill within seconds
STALL_BODY = (b'{"messages": [{"role": "user", "content": "Say something."}], "stream": true,'
              b' "max_tokens": 30000, "ignore_eos": true, "temperature": 0,'
              b' "logprobs": true, "top_logprobs": 20}')


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "2", "--slots",
                  "--ctx-size", "65536", "--api-key", API_KEY, "--timeout", "2",
                  "--body-timeout", "2"])
    yield srv
    srv.stop()


def raw_socket(server, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", server.port))
    return sock


def request_head(server, method: str, path: str, length: int, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def wait_for(check, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_client_that_stops_reading_frees_its_slot(server, http):
    sock = raw_socket(server, rcvbuf=4096)
    try:
        sock.sendall(request_head(server, "POST", "/v1/chat/completions", len(STALL_BODY))
                     + STALL_BODY)
        states = lambda: [s["state"] for s in http.get("/slots").json()]  # noqa: E731
        assert wait_for(lambda: "decoding" in states(), 30), states()
        active = lambda: http.get("/health").json()["batch"][  # noqa: E731
            "active_sequences"]
        assert wait_for(lambda: states() == ["idle", "idle"] and active() == 0, 60), \
            (states(), active())
    finally:
        sock.close()
    assert "write_timeout" in server.log()


def test_stalled_body_gets_408(server):
    sock = raw_socket(server)
    sock.settimeout(10)
    try:
        started = time.monotonic()
        sock.sendall(request_head(server, "POST", "/v1/chat/completions", 100) + b"{")
        reply = sock.recv(65536)
        elapsed = time.monotonic() - started
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"invalid_request_error"' in reply
    assert 1.5 <= elapsed <= 5, elapsed


def test_rebinding_host_is_403(server):
    resp = httpx.get(server.base_url + "/v1/models", headers={**KEY, "Host": "evil.example"})
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = httpx.get(server.base_url + "/v1/models",  # a foreign origin: CORS's business
                     headers={**KEY, "Origin": "http://evil.example"})
    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers
    assert httpx.get(server.base_url + "/v1/models",
                     headers={**KEY, "Host": f"localhost:{server.port}"}).status_code == 200


def test_head_health_and_unknown_routes(server, http):
    head = httpx.head(server.base_url + "/health")
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(server.base_url + "/nope").status_code == 401  # key before 404
    missing = http.get("/nope", headers={"x-request-id": "e2e-404"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "e2e-404"
    assert missing.json()["error"]["type"] == "not_found_error"
    form = http.post("/v1/chat/completions", content=b"{}",
                     headers={"Content-Type": "text/plain", "Origin": "http://localhost"})
    assert form.status_code == 415
