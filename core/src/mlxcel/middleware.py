"""ASGI middleware: request id, API-key auth, and one log line per request."""

from __future__ import annotations

import hmac
import time
import uuid
from typing import Any

import msgspec
import structlog

log = structlog.get_logger("mlxcel.http")
OPEN_PATHS = frozenset({"/health", "/"})
_encode = msgspec.json.Encoder().encode


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _auth_error(api_key: str, header: str | None) -> tuple[str, str] | None:
    """None if allowed, else (type, message). Accepts ``Bearer <key>`` or the raw key."""
    if not header or not header.strip():
        return "missing_api_key", "Missing API key: send it as 'Authorization: Bearer <key>'"
    token = header.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    if hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    return "invalid_api_key", "Invalid API key"


class ServerMiddleware:
    """Binds a request id, enforces ``--api-key``, logs status/ms/tokens per request."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        started, status = time.perf_counter(), [500]

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"],
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            denied = None
            if self.api_key and scope["path"] not in OPEN_PATHS:
                denied = _auth_error(self.api_key, _header(scope, b"authorization"))
            if denied:
                await self._reject(send_wrapper, 401, *denied)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            usage = state.get("usage") or (None, None)
            log.info("request", request_id=request_id, method=scope.get("method"),
                     route=scope["path"], status=status[0],
                     ms=round((time.perf_counter() - started) * 1000, 1),
                     prompt_tokens=usage[0], completion_tokens=usage[1])

    @staticmethod
    async def _reject(send: Any, status: int, type_: str, message: str) -> None:
        body = _encode({"error": {"message": message, "type": type_, "code": type_}})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
