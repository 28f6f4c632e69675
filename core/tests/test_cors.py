"""CORS as llama-server answers it: every OPTIONS is a preflight answered 200 without an
API key, every response (errors included) names an allowed Origin, and --cors-origins,
--cors-methods, --cors-headers and --cors-credentials shape the answers."""

from __future__ import annotations

import pytest
from litestar import Litestar, get, post
from litestar.testing import TestClient
from mlxcel.app import guard_app
from mlxcel.cors import CorsPolicy
from mlxcel.dialects.shapes import ErrorShapes
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings

SHAPES = ErrorShapes(load_plugins().dialects)
KEY = "k-cors-test"
SITE = "http://localhost:5173"  # a page served from another local port
PREFLIGHT = {"Origin": SITE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


@get(["/health", "/"])
async def health() -> dict:
    return {"status": "ok"}


@post("/v1/chat/completions", status_code=200)
async def chat() -> dict:
    return {"ok": True}


def client(listening: bool = False, base: str = "127.0.0.1:8080", **settings) -> TestClient:
    app = guard_app(Litestar([health, chat], exception_handlers=SHAPES.app_handlers()),
                    Settings(**settings), listening=listening, shapes=SHAPES)
    return TestClient(app, base_url=f"http://{base}", raise_server_exceptions=False)


def allows(resp, origin: str = SITE) -> bool:
    return resp.headers.get("access-control-allow-origin") == origin


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/health", "/no/such/route", "/"])
def test_a_preflight_is_200_with_cors_headers_on_any_route_without_a_key(path):
    with client(api_key=KEY) as c:
        resp = c.options(path, headers=PREFLIGHT)
    assert resp.status_code == 200 and resp.content == b""
    assert allows(resp) and resp.headers["vary"] == "Origin"
    assert resp.headers["access-control-allow-credentials"] == "true"
    assert resp.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert resp.headers["access-control-allow-headers"] == "authorization, content-type"
    assert resp.headers["x-request-id"]


def test_error_responses_carry_the_cors_headers():
    with client(api_key=KEY) as c:
        no_key = c.post("/v1/chat/completions", json={}, headers={"Origin": SITE})
        missing = c.get("/nope", headers={"Origin": SITE, "Authorization": f"Bearer {KEY}"})
        form = c.post("/v1/chat/completions", content=b"x", headers={
            "Origin": SITE, "Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
        ok = c.post("/v1/chat/completions", json={},
                    headers={"Origin": SITE, "Authorization": f"Bearer {KEY}"})
    assert [r.status_code for r in (no_key, missing, form, ok)] == [401, 404, 415, 200]
    for resp in (no_key, missing, form, ok):
        assert allows(resp) and resp.headers["access-control-allow-credentials"] == "true"
        assert resp.headers["access-control-expose-headers"] == "x-request-id"


def test_no_origin_no_cors_headers():
    with client() as c:
        resp = c.get("/health")
    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


def test_listed_origins_only_and_the_other_flags():
    with client(cors_origins="https://app.example:3000", cors_methods="get,post",
                cors_headers="Authorization", cors_credentials=False) as c:
        listed = c.options("/v1/chat/completions",
                           headers={**PREFLIGHT, "Origin": "https://app.example:3000"})
        other = c.options("/v1/chat/completions", headers=PREFLIGHT)
        plain = c.get("/health", headers={"Origin": SITE})
    assert listed.status_code == 200 and allows(listed, "https://app.example:3000")
    assert listed.headers["access-control-allow-methods"] == "GET, POST"
    assert listed.headers["access-control-allow-headers"] == "Authorization"
    assert "access-control-allow-credentials" not in listed.headers
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_localhost_allows_loopback_origins_only():
    policy = CorsPolicy.from_flags("localhost", "GET", "*", True)
    assert policy.allows("http://127.0.0.1:3000") and policy.allows("http://localhost")
    assert policy.allows("http://[::1]:8000") and not policy.allows("https://evil.example")


def test_a_listed_origin_is_answered_and_others_get_no_cors_headers_not_403():
    """As llama-server: an origin not allowed gets the answer without CORS headers (a
    preflight too is 200), and the browser refuses it; only the Host is checked."""
    with client(listening=True, cors_origins="https://app.example") as c:
        listed = c.post("/v1/chat/completions", json={},
                        headers={"Origin": "https://app.example"})
        other = c.post("/v1/chat/completions", json={},
                       headers={"Origin": "https://evil.example"})
        preflight = c.options("/v1/chat/completions",
                              headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert listed.status_code == 200 and allows(listed, "https://app.example")
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    assert preflight.status_code == 200
    assert not [h for h in preflight.headers if h.startswith("access-control-")]


def test_the_default_answers_loopback_origins_on_a_loopback_bind():
    with client(listening=True) as c:
        local = c.options("/v1/chat/completions", headers=PREFLIGHT)
        remote = c.options("/v1/chat/completions",
                           headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert local.status_code == 200 and allows(local)
    assert remote.status_code == 200 and "access-control-allow-origin" not in remote.headers


def test_on_a_public_bind_any_origin_is_answered_when_star_is_asked():
    with client(listening=True, base="203.0.113.7:8080", host="0.0.0.0",
                cors_origins="*") as c:
        resp = c.options("/v1/chat/completions",
                         headers={**PREFLIGHT, "Origin": "https://any.example"})
    assert resp.status_code == 200 and allows(resp, "https://any.example")


def test_the_default_answers_loopback_origins_only_and_never_null():
    """Another site, or ``Origin: null``, gets no CORS answer by default; ``null`` gets
    none even with ``*`` (any page can send it, and credentials are allowed)."""
    with client(listening=True, base="203.0.113.7:8080", host="0.0.0.0") as c:
        local = c.options("/v1/chat/completions", headers=PREFLIGHT)
        other = c.post("/v1/chat/completions", json={}, headers={"Origin": "https://any.example"})
        null = c.post("/v1/chat/completions", json={}, headers={"Origin": "null"})
    assert allows(local)
    assert other.status_code == null.status_code == 200
    assert "access-control-allow-origin" not in other.headers
    assert "access-control-allow-origin" not in null.headers
    with client(listening=True, base="203.0.113.7:8080", host="0.0.0.0",
                cors_origins="*") as c:
        null = c.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "null"})
    assert "access-control-allow-origin" not in null.headers
    assert "access-control-allow-credentials" not in null.headers
