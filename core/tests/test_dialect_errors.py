"""The dialect boundary: core errors carry meaning only, and every error body takes the
shape of the dialect that owns the path (its routes' errors, and the app's 404 / 405 /
401 / 415 outside any route)."""

from __future__ import annotations

import inspect
import pathlib

import mlxcel
from apphelpers import wait_ready
from litestar import get
from litestar.testing import TestClient
from mlxcel import errors
from mlxcel.app import create_app
from mlxcel.dialects.api import Dialect
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings

CORE = pathlib.Path(mlxcel.__file__).parent
WIRE_TYPES = ("invalid_request_error", "not_found_error", "server_busy", "server_error",
              "not_supported_error", "authentication_error")


def anthropic_body(exc):
    """A second shape, as the Anthropic dialect will answer."""
    return {"type": "error", "error": {"type": type(exc).__name__, "message": exc.message}}


def build(ctx):
    @get("/v1/messages/fails")
    async def fails() -> dict:
        raise errors.InvalidRequest("bad message")

    return [fails]


def test_core_errors_name_no_wire_type():
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.MlxcelError):
            assert "type" not in vars(cls), cls
    outside = [p for p in CORE.rglob("*.py") if "dialects" not in p.parts
               and "testing" not in p.parts]
    for path in outside:
        text = path.read_text()
        assert not [t for t in WIRE_TYPES if f'"{t}"' in text], path


def _client(checkpoint, **settings):
    plugins = load_plugins(deny=["dialect-anthropic"])  # the stand-in owns its prefix
    plugins.dialects.add(Dialect(
        name="messages-test", routes=f"{__name__}:build", errors=f"{__name__}:anthropic_body",
        prefixes=("/v1/messages",)))
    app = create_app(Settings(model=str(checkpoint), alias="tiny", **settings), plugins)
    return TestClient(app, raise_server_exceptions=False)


def test_error_bodies_take_the_shape_of_the_path_owner(tiny_checkpoint):
    with _client(tiny_checkpoint, parallel=1) as c:
        wait_ready(c)
        own = c.get("/v1/messages/fails")  # raised inside its routes
        assert own.status_code == 400
        assert own.json() == {"type": "error", "error": {"type": "InvalidRequest",
                                                         "message": "bad message"}}
        unknown = c.get("/v1/messages/nope")  # no route: the app's 404, by prefix
        assert unknown.status_code == 404 and unknown.json()["type"] == "error"
        assert unknown.json()["error"]["type"] == "NotFound"
        method = c.delete("/v1/messages/fails")
        assert method.status_code == 405 and method.json()["error"]["type"] == "MethodNotAllowed"
        openai = c.get("/v1/nope")  # the OpenAI dialect's paths keep its shape
        assert openai.status_code == 404
        assert openai.json()["error"]["type"] == "not_found_error"
        bad = c.post("/v1/chat/completions", json={"messages": "no"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        other = c.get("/somewhere")  # nobody's: the OpenAI shape
        assert other.json()["error"]["type"] == "not_found_error"


def test_edge_refusals_take_the_shape_of_the_path_owner(tiny_checkpoint):
    with _client(tiny_checkpoint, parallel=1, api_key="k") as c:
        wait_ready(c)
        r = c.post("/v1/messages", json={})
        assert r.status_code == 401
        assert r.json() == {"type": "error", "error": {"type": "MissingApiKey",
                                                       "message": r.json()["error"]["message"]}}
        r = c.post("/v1/messages", content=b"x", headers={"x-api-key": "k",
                                                          "content-type": "image/png"})
        assert r.status_code == 415 and r.json()["error"]["type"] == "UnsupportedMediaType"
        r = c.get("/v1/models", headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_api_key"
        assert c.get("/v1/messages/fails", headers={"x-api-key": "k"}).status_code == 400
