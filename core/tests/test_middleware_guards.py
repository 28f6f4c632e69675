"""The edge middleware around the whole app: request ids, 404/405/HEAD, API key before
routing, Content-Type (415), Host (403), body-read (408) and write timeouts."""

from __future__ import annotations

import asyncio
import time

import pytest
from litestar import Litestar, Request, get, post
from litestar.response import Stream
from litestar.testing import TestClient
from mlxcel.app import guard_app
from mlxcel.dialects.shapes import ErrorShapes
from mlxcel.http_guard import HostPolicy, content_type_denial, request_id
from mlxcel.logging import configure
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings

SHAPES = ErrorShapes(load_plugins().dialects)  # the OpenAI shape by default

KEY = "k-guard-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
closed: list[str] = []


@pytest.fixture(autouse=True)
def console_logs():
    configure("console")


@get(["/health", "/"])
async def health() -> dict:
    return {"status": "ok"}


@get("/ping")
async def ping() -> dict:
    return {"pong": True}


@post("/echo", status_code=200)
async def echo(request: Request) -> dict:
    return {"bytes": len(await request.body())}


@get("/stream")
async def stream() -> Stream:
    async def chunks():
        try:
            while True:
                yield b"data: " + b"x" * 4096 + b"\n\n"
                await asyncio.sleep(0)
        finally:
            closed.append("stream")

    return Stream(chunks(), media_type="text/event-stream")


def guarded(listening: bool = False, **settings) -> Litestar:
    app = Litestar([health, ping, echo, stream], exception_handlers=SHAPES.app_handlers())
    return guard_app(app, Settings(**settings), listening=listening, shapes=SHAPES)


def client(base_url: str = "http://testserver.local", **kw) -> TestClient:
    return TestClient(guarded(**kw), base_url=base_url, raise_server_exceptions=False)


def assert_openai_error(resp, status: int, type_: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == type_ and isinstance(err["message"], str) and err["message"]
    assert "code" in err


def test_404_and_405_pass_the_middleware(capsys):
    with client() as c:
        missing = c.get("/nope", headers={"x-request-id": "rid-404"})
        wrong = c.delete("/ping")
    assert_openai_error(missing, 404, "not_found_error")
    assert missing.headers["x-request-id"] == "rid-404"
    assert_openai_error(wrong, 405, "invalid_request_error")
    assert len(wrong.headers["x-request-id"]) == 32
    err = capsys.readouterr().err
    assert "rid-404" in err and "status=404" in err and "status=405" in err


def test_key_is_required_before_routing():
    with client(api_key=KEY) as c:
        assert_openai_error(c.get("/nope"), 401, "missing_api_key")
        assert_openai_error(c.get("/nope", headers={"Authorization": "Bearer no"}), 401,
                            "invalid_api_key")
        assert c.get("/nope", headers=AUTH).status_code == 404
        assert c.get("/health").status_code == 200  # open without the key


def test_head_health_is_200_without_body():
    with client(api_key=KEY) as c:
        for path in ("/health", "/"):
            resp = c.head(path)
            assert resp.status_code == 200 and resp.content == b""
            assert resp.headers["x-request-id"]


def test_head_on_real_app_health(client):
    resp = client.head("/health")
    assert resp.status_code == 200 and resp.content == b""


@pytest.mark.parametrize(("sent", "kept"), [
    (b"abc-123", True), (b"x" * 128, True), (b"x" * 129, False), (b"a b", False),
    (b"caf\xe9", False), (b"tab\there", False), (b"", False)])
def test_request_id_rules(sent, kept):
    assert (request_id(sent) == sent.decode("latin-1")) is kept
    with client() as c:
        got = c.get("/ping", headers=[(b"x-request-id", sent)]).headers["x-request-id"]
    if kept:
        assert got == sent.decode()
    else:
        assert got != sent.decode("latin-1") and len(got) == 32 and got.isalnum()


@pytest.mark.parametrize(("ctype", "extra", "status"), [
    ("application/json", {}, 200),
    ("application/json; charset=utf-8", {}, 200),
    ("application/vnd.api+json", {}, 200),
    (None, {}, 200),
    ("application/x-www-form-urlencoded", {}, 200),  # curl -d '{...}'
    ("text/plain", {}, 200),
    ("application/x-www-form-urlencoded", {"Origin": "http://localhost:3000"}, 415),
    ("text/plain", {"Sec-Fetch-Site": "cross-site"}, 415),
    ("text/plain;charset=UTF-8", {"Sec-Fetch-Mode": "no-cors"}, 415),
    ("multipart/form-data; boundary=x", {}, 415),
    ("application/xml", {}, 415),
])
def test_content_type_rule(ctype, extra, status):
    headers = {**extra, **({"Content-Type": ctype} if ctype else {})}
    with client() as c:
        resp = c.post("/echo", content=b'{"a": 1}', headers=headers)
    if status == 200:
        assert resp.status_code == 200 and resp.json() == {"bytes": 8}
    else:
        assert_openai_error(resp, 415, "invalid_request_error")
        assert resp.json()["error"]["code"] is None


def test_content_type_message_names_no_payload():
    message = content_type_denial("application/x-evil-<script>", False)
    assert message and "evil" not in message and "script" not in message


def test_host_policy_rules():
    assert HostPolicy.from_settings("127.0.0.1", None).names == {"localhost", "127.0.0.1",
                                                                "::1"}
    assert HostPolicy.from_settings("0.0.0.0", None).names is None
    assert HostPolicy.from_settings("127.0.0.1", "*").names is None
    assert HostPolicy.from_settings("127.0.0.1", None, listening=False).names is None
    policy = HostPolicy.from_settings("0.0.0.0", "api.example, Box:8080")
    assert {"api.example", "box", "localhost"} <= policy.names
    assert policy.denial("API.example:443") is None
    assert policy.denial("evil.example")
    assert policy.denial("box") is None and policy.denial("[::1]:8080") is None
    both = HostPolicy.from_settings("127.0.0.1,::1", None)
    assert both.names == {"localhost", "127.0.0.1", "::1"}
    assert HostPolicy.from_settings("127.0.0.1,0.0.0.0", None).names is None


@pytest.mark.parametrize(("base", "headers", "status"), [
    ("http://testserver.local", {}, 403),  # a rebinding name
    ("http://127.0.0.1:8080", {}, 200),
    ("http://127.0.0.1:8080", {"Host": "evil.example:8080"}, 403),
    ("http://127.0.0.1:8080", {"Host": "localhost:8080"}, 200),
    ("http://127.0.0.1:8080", {"Host": "[::1]:8080"}, 200),
    ("http://127.0.0.1:8080", {"Origin": "http://evil.example"}, 200),  # CORS: no headers
    ("http://127.0.0.1:8080", {"Origin": "http://localhost:3000"}, 200),
])
def test_loopback_listener_checks_host_not_origin(base, headers, status):
    with client(base, listening=True, host="127.0.0.1", api_key=KEY) as c:
        resp = c.get("/health", headers=headers)  # open route: 403 comes before the key
    if status == 403:
        assert_openai_error(resp, 403, "invalid_request_error")
        assert "evil" not in resp.text
    else:
        assert resp.status_code == status, resp.text


def test_allowed_hosts_extends_and_star_disables():
    with client("http://api.example", listening=True, allowed_hosts="api.example") as c:
        assert c.get("/ping").status_code == 200
        assert c.get("/ping", headers={"Host": "other.example"}).status_code == 403
    with client("http://anything.example", listening=True, allowed_hosts="*") as c:
        assert c.get("/ping", headers={"Origin": "http://evil.example"}).status_code == 200
    with client("http://anything.example", listening=True, host="0.0.0.0") as c:
        assert c.get("/ping").status_code == 200


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"localhost"),
                                                                *headers],
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080)}


def _drive(app, scope, receive, send, limit: float) -> list[str]:
    """Run one request; returns ``closed`` as it was when the app returned (before the loop
    shuts down and closes any generator left open)."""
    async def run() -> list[str]:
        await asyncio.wait_for(app(scope, receive, send), limit)
        return list(closed)

    return asyncio.run(run())


def _then_hang(*messages: dict):
    """An ASGI ``receive`` that gives ``messages`` and then never returns: a client that
    sends no more and does not disconnect."""
    calls = iter(messages)

    async def receive():
        try:
            return next(calls)
        except StopIteration:
            await asyncio.sleep(3600)

    return receive


def test_body_timeout_answers_408():
    app = guarded(body_timeout=0.3)
    sent: list[dict] = []
    # the rest of the body never comes
    receive = _then_hang({"type": "http.request", "body": b"{", "more_body": True})

    async def send(message):
        sent.append(message)

    started = time.monotonic()
    _drive(app, _scope("POST", "/echo", [(b"content-length", b"100")]), receive, send, 5)
    elapsed = time.monotonic() - started
    assert 0.25 < elapsed < 2, elapsed
    assert sent[0]["status"] == 408
    assert b'"invalid_request_error"' in sent[1]["body"]


def test_complete_body_then_waiting_does_not_time_out():
    app = guarded(body_timeout=0.2)
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b'{"a":1}', "more_body": False}

    async def slow_send(message):
        await asyncio.sleep(0.15)  # the response outlives the body deadline
        sent.append(message)

    _drive(app, _scope("POST", "/echo", [(b"content-type", b"application/json")]),
           receive, slow_send, 5)
    assert sent[0]["status"] == 200 and b'"bytes":7' in sent[1]["body"]


def test_write_timeout_ends_stream_and_closes_generator(capsys):
    app = guarded(timeout=0.3)
    closed.clear()
    sent: list[dict] = []

    # the client neither reads nor disconnects
    receive = _then_hang({"type": "http.request", "body": b"", "more_body": False})

    async def send(message):
        sent.append(message)
        if len(sent) > 3:
            await asyncio.Event().wait()  # the socket buffer is full: send blocks

    started = time.monotonic()
    closed_at_return = _drive(app, _scope("GET", "/stream", []), receive, send, 5)
    assert time.monotonic() - started < 3
    assert sent[0]["status"] == 200
    # the generator's finally ran before the app returned (a real stream cancels there)
    assert closed_at_return == ["stream"]
    assert len(sent) == 4  # nothing more reached the stalled client
    assert "write_timeout" in capsys.readouterr().err
