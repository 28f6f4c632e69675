"""Which dialect's error body a response takes: the one that owns the request's path.

Errors raised inside a dialect's routes take that dialect's shape through its Router's
exception handlers (``router_handlers``). Responses made outside any route — an unknown
path or method (404 / 405), a key, Host or Content-Type refused at the edge (401 / 403 /
415), a body read timeout (408), an unexpected failure (500) — take the shape of the
dialect whose ``Dialect.prefixes`` holds the longest prefix of the path, and by default the
OpenAI one (what llama-server and OpenAI clients read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from mlxcel import errors as e
from mlxcel.lazy import resolve

log = structlog.get_logger("mlxcel.app")
Body = Callable[[e.MlxcelError], dict[str, Any]]
_HTTP = {401: e.Unauthorized, 403: e.Forbidden, 404: e.NotFound, 405: e.MethodNotAllowed,
         408: e.BodyTimeout, 413: e.PayloadTooLarge, 415: e.UnsupportedMediaType}
_encode = msgspec.json.Encoder().encode


def _fallback(exc: e.MlxcelError) -> dict[str, Any]:
    """With no dialect installed for the path: the message and the reason code only."""
    return {"error": {"message": exc.message, "code": exc.code}}


def meaning(request: Request, exc: Exception) -> e.MlxcelError:
    """Any exception as the core error it means (unexpected ones logged once, answered
    without their details)."""
    if isinstance(exc, e.MlxcelError):
        return exc
    if isinstance(exc, HTTPException):
        status = exc.status_code
        if status == 404:
            return e.NotFound(f"Not found: {request.method} {request.url.path}")
        if isinstance(exc, ValidationException):
            return e.InvalidRequest(f"Invalid request: {exc.detail}")
        cls = _HTTP.get(status, e.InvalidRequest if 400 <= status < 500 else e.ServerError)
        err = cls(exc.detail)
        err.status = status
        return err
    log.exception("unhandled_error", route=request.url.path)
    return e.ServerError()


def response(exc: e.MlxcelError, body: Body) -> Response:
    return Response(body(exc), status_code=exc.status, media_type="application/json")


def router_handlers(body: Body) -> dict[Any, Any]:
    """Litestar exception handlers that answer in ``body``'s shape (a dialect's Router)."""
    def handle(request: Request, exc: Exception) -> Response:
        return response(meaning(request, exc), body)
    return {e.MlxcelError: handle, HTTPException: handle, Exception: handle}


class ErrorShapes:
    """Path prefix -> error body, from the installed dialects."""

    def __init__(self, dialects: Any) -> None:
        self.default: Body = _fallback
        self.by_prefix: list[tuple[str, Body]] = []
        self.of_dialect: dict[str, Body] = {}
        for name, dialect in dialects.items():
            body = resolve(dialect.errors) if dialect.errors else _fallback
            self.of_dialect[name] = body
            self.by_prefix += [(prefix, body) for prefix in dialect.prefixes]
            if name == "openai":
                self.default = body
        self.by_prefix.sort(key=lambda item: -len(item[0]))

    def body_for(self, path: str) -> Body:
        return next((body for prefix, body in self.by_prefix if path.startswith(prefix)),
                    self.default)

    def encode(self, path: str, exc: e.MlxcelError) -> bytes:
        return _encode(self.body_for(path)(exc))

    def app_handlers(self) -> dict[Any, Any]:
        """The app's handlers, for what no dialect Router caught (no route matched)."""
        def handle(request: Request, exc: Exception) -> Response:
            return response(meaning(request, exc), self.body_for(request.url.path))
        return {e.MlxcelError: handle, HTTPException: handle, Exception: handle}
