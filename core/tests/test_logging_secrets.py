"""Logs of a failing request: the plain traceback and the request id, never the API key,
an Authorization value or frame locals; the 500 body stays generic."""

from __future__ import annotations

import json

import pytest
from litestar import Litestar, Request, get
from litestar.testing import TestClient
from mlxcel.app import guard_app
from mlxcel.dialects.shapes import ErrorShapes
from mlxcel.logging import REDACTED, Redactor, configure
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings

SHAPES = ErrorShapes(load_plugins().dialects)  # the OpenAI shape by default

KEY = "sk-live-0123456789abcdef"
LOCAL_MARK = "frame-local-value-7f3a"


@get("/boom")
async def boom(request: Request) -> str:
    settings = Settings(api_key=KEY)  # noqa: F841  (a local that show_locals would print)
    marker = LOCAL_MARK  # noqa: F841
    auth = request.headers.get("authorization")  # noqa: F841
    raise RuntimeError(f"deliberate failure (key {KEY}, header Authorization: Bearer other)")


@pytest.fixture(autouse=True)
def restore_logging():
    yield
    configure("console")


def fail_once(fmt: str, capsys) -> tuple[object, str]:
    configure(fmt, secrets=[KEY])
    app = guard_app(Litestar([boom], exception_handlers=SHAPES.app_handlers()),
                    Settings(api_key=KEY), shapes=SHAPES)
    capsys.readouterr()
    with TestClient(app, raise_server_exceptions=False) as c:
        resp = c.get("/boom", headers={"Authorization": f"Bearer {KEY}",
                                       "x-request-id": "rid-secret-test"})
    return resp, capsys.readouterr().err


def assert_clean(resp, log: str) -> None:
    assert resp.status_code == 500
    assert resp.json() == {"error": {"message": "Internal server error",
                                     "type": "server_error", "code": None}}
    assert "Traceback" not in resp.text and KEY not in resp.text
    assert KEY not in log
    assert LOCAL_MARK not in log  # no frame locals
    assert "Bearer other" not in log
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: deliberate failure" in log
    assert REDACTED in log


def test_console_log_has_plain_traceback_and_no_secrets(capsys):
    resp, log = fail_once("console", capsys)
    assert_clean(resp, log)
    error_line = next(line for line in log.splitlines() if "unhandled_error" in line)
    assert "request_id=rid-secret-test" in error_line
    assert log.count("unhandled_error") == 1  # logged once


def test_json_log_carries_exception_text_and_request_id(capsys):
    resp, log = fail_once("json", capsys)
    assert_clean(resp, log)
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    errors = [e for e in events if e["event"] == "unhandled_error"]
    assert len(errors) == 1
    assert errors[0]["request_id"] == "rid-secret-test"
    assert errors[0]["exception"].startswith("Traceback (most recent call last)")
    access = [e for e in events if e["event"] == "request"]
    assert access[0]["request_id"] == "rid-secret-test" and access[0]["status"] == 500


def test_redactor_covers_keys_pairs_and_text():
    red = Redactor(["s3cret-key"])
    out = red(None, "info", {
        "event": "x", "Authorization": "Bearer abc", "x-api-key": "abc",
        "nested": {"api_key": "abc", "other": "has s3cret-key inside"},
        "headers": [(b"authorization", b"Bearer abc"), (b"host", b"localhost")],
        "text": "api_key='abc123' then x-api-key: zzz9 and authorization=Bearer tok9"})
    flat = json.dumps(out, default=str)
    for leaked in ("abc123", "zzz9", "tok9", "s3cret-key", "Bearer abc"):
        assert leaked not in flat, leaked
    assert out["headers"][1] == ["host", "localhost"]
    assert out["event"] == "x"
