"""ASGI middleware around the whole app: request id, Host, CORS, API key,
Content-Type, body-read and write timeouts, and one log line per request."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from contextvars import ContextVar
from typing import Any

import msgspec
import structlog

from mlxcel import errors
from mlxcel.cors import CorsPolicy
from mlxcel.errors import BodyTimeout, MlxcelError
from mlxcel.http_guard import HostPolicy, content_type_denial, request_id
from mlxcel.sendbuf import bound_unread

log = structlog.get_logger("mlxcel.http")
OPEN_PATHS = frozenset({"/health", "/live", "/"})
_encode = msgspec.json.Encoder().encode
_BROWSER_HEADERS = (b"origin", b"sec-fetch-site", b"sec-fetch-mode")
# the request's key scope: a hash of the API key that admitted it ("" on a keyless server);
# stores scoped per client read it (never the key itself)
KEY_SCOPE = "api_key_scope"
key_scope_var: ContextVar[str] = ContextVar(KEY_SCOPE, default="")


def key_scope(scope: dict) -> str:
    """The key scope the middleware put on a request's ASGI scope."""
    return scope.get("state", {}).get(KEY_SCOPE, "")


class GuardConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the middleware enforces (built from ``Settings`` by the app)."""

    api_keys: tuple[str, ...] = ()  # any one admits a request (none: no key asked)
    hosts: HostPolicy = HostPolicy(None)
    body_timeout: float = 60.0
    write_timeout: float = 600.0
    # (path, error) -> body bytes: the dialect owning the path (mlxcel.dialects.shapes)
    error_body: Any = None
    cors: CorsPolicy = CorsPolicy()


def _headers(scope: dict) -> dict[bytes, bytes]:
    """Lower-cased header names -> the first raw value (bytes, never re-encoded)."""
    out: dict[bytes, bytes] = {}
    for key, value in scope.get("headers", ()):
        out.setdefault(key.lower(), value)
    return out


def _text(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _offered(authorization: str | None, x_api_key: str | None) -> list[str]:
    """The keys a request offers: ``Authorization`` (``Bearer <key>`` or the raw key),
    then ``x-api-key``."""
    offered = []
    if authorization and authorization.strip():
        token = authorization.strip()
        offered.append(token[7:].strip() if token[:7].lower() == "bearer " else token)
    if x_api_key and x_api_key.strip():
        offered.append(x_api_key.strip())
    return offered


def _auth_error(api_keys: tuple[str, ...], authorization: str | None,
                x_api_key: str | None = None) -> MlxcelError | None:
    """None if allowed, else the error. The key may come as ``Authorization: Bearer
    <key>``, as the raw key in ``Authorization``, or as ``x-api-key: <key>`` (what the
    Anthropic SDK sends); any one that matches any of ``api_keys`` admits the request.
    Never from the query string, where proxies and logs keep URLs. Every offered key is
    compared with every key in constant time, and no message repeats it."""
    offered = _offered(authorization, x_api_key)
    if not offered:
        return errors.MissingApiKey("Missing API key: send it as 'Authorization: Bearer "
                                    "<key>' or 'x-api-key: <key>'")
    matches = [hmac.compare_digest(token.encode(), key.encode())
               for token in offered for key in api_keys]
    return None if any(matches) else errors.InvalidApiKey("Invalid API key")


def _scope_of(api_keys: tuple[str, ...], authorization: str | None,
              x_api_key: str | None) -> str:
    """A hash of the configured key that admitted the request (as ``_auth_error`` reads
    the offered keys, compared in constant time), so that stores can keep each client's
    entries apart without holding the key."""
    for token in _offered(authorization, x_api_key):
        for key in api_keys:
            if hmac.compare_digest(token.encode(), key.encode()):
                return hashlib.sha256(b"mlxcel-key-scope:" + key.encode()).hexdigest()[:32]
    return ""


class _Deadline:
    """``async with _Deadline(seconds):`` raises TimeoutError when the block runs longer
    (``asyncio.timeout`` needs Python 3.11; this is one timer handle per block, cheap
    enough for every SSE write)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False

    async def __aenter__(self) -> _Deadline:
        task = asyncio.current_task()
        self._handle = asyncio.get_running_loop().call_later(self.seconds, self._fire, task)
        return self

    def _fire(self, task: asyncio.Task) -> None:
        self.fired = True
        task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._handle.cancel()
        if self.fired and exc_type is asyncio.CancelledError:
            uncancel = getattr(asyncio.current_task(), "uncancel", None)
            if uncancel is not None:
                uncancel()
            raise TimeoutError from None
        return False


def _streaming(start: dict) -> bool:
    """An SSE response: long-lived, holding a slot while the client reads it."""
    return any(key.lower() == b"content-type" and value.startswith(b"text/event-stream")
               for key, value in start.get("headers", ()))


def _plain_body(path: str, exc: MlxcelError) -> bytes:
    return _encode({"error": {"message": exc.message, "code": exc.code}})


class _Exchange:
    """One request's wrapped ``receive``/``send`` and what they observed."""

    def __init__(self, cfg: GuardConfig, receive: Any, send: Any, rid: str, head: bool,
                 cors: list[tuple[bytes, bytes]] | None = None) -> None:
        self.cfg, self._receive, self._send, self.rid, self.head = cfg, receive, send, rid, head
        self.cors = cors or []  # every response's CORS headers (mlxcel.cors)
        self.deadline = time.monotonic() + cfg.body_timeout
        self.body_done = False
        self.status = 500
        self.started = self.body_timed_out = self.write_timed_out = False
        self._gone: asyncio.Future | None = None  # resolved on a write timeout
        self.scope: dict = {}  # the request's, for the connection's addresses

    async def receive(self) -> dict:
        """Until the body is complete each call waits at most until the body deadline (408);
        after that (waiting for a disconnect) it waits as long as it must."""
        if self.body_done or self.write_timed_out:
            return await self._until_gone()
        try:
            async with _Deadline(max(self.deadline - time.monotonic(), 0.0)):
                message = await self._receive()
        except TimeoutError:
            self.body_timed_out = True
            raise BodyTimeout("request body not received in time") from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    def _gone_future(self) -> asyncio.Future:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        return self._gone

    async def _until_gone(self) -> dict:
        """The next message, or ``http.disconnect`` once a write timed out: the app then
        stops its response the way it does for a client that left (generation cancelled)."""
        gone = self._gone_future()
        if gone.done():
            return {"type": "http.disconnect"}
        recv = asyncio.ensure_future(self._receive())
        await asyncio.wait((recv, gone), return_when=asyncio.FIRST_COMPLETED)
        if recv.done():
            return recv.result()
        recv.cancel()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        """Adds ``x-request-id`` and the CORS headers; drops HEAD bodies. A send that waits
        longer than the write timeout abandons the response: later sends are dropped and
        the app is told the client disconnected, so a stream ends and its generation is
        cancelled."""
        if self.write_timed_out:
            return
        if message["type"] == "http.response.start":
            self.started, self.status = True, message["status"]
            if _streaming(message):  # bound its unread bytes (mlxcel.sendbuf)
                await asyncio.to_thread(bound_unread, self.scope)
            extra = [(b"x-request-id", self.rid.encode()), *self.cors]
            if self.body_timed_out:
                extra.append((b"connection", b"close"))
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        elif message["type"] == "http.response.body" and self.head:
            message = {**message, "body": b""}
        try:
            async with _Deadline(self.cfg.write_timeout):
                await self._send(message)
        except TimeoutError:
            self.write_timed_out = True
            self._gone_future().set_result(None)
            log.warning("write_timeout", timeout_s=self.cfg.write_timeout)

    async def reject(self, exc: MlxcelError, path: str) -> None:
        body = (self.cfg.error_body or _plain_body)(path, exc)
        await self.send({"type": "http.response.start", "status": exc.status,
                         "headers": [(b"content-type", b"application/json"),
                                     (b"content-length", str(len(body)).encode())]})
        await self.send({"type": "http.response.body", "body": body})

    async def preflight(self, extra: list[tuple[bytes, bytes]]) -> None:
        """200 with an empty body, as llama-server answers every OPTIONS request."""
        await self.send({"type": "http.response.start", "status": 200,
                         "headers": [(b"content-length", b"0"), *extra]})
        await self.send({"type": "http.response.body", "body": b""})


class ServerMiddleware:
    """Wraps the whole ASGI app (unknown routes and 405s included), so every response gets
    a request id, the edge checks and an access-log line."""

    def __init__(self, app: Any, cfg: GuardConfig) -> None:
        self.app = app
        self.cfg = cfg

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        rid = request_id(headers.get(b"x-request-id")) or uuid.uuid4().hex
        head = scope.get("method") == "HEAD"
        if head:  # answered as GET without the body
            scope = {**scope, "method": "GET"}
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        origin = _text(headers, b"origin")
        ex = _Exchange(self.cfg, receive, send, rid, head, self.cfg.cors.response_headers(origin))
        ex.scope = scope
        started = time.perf_counter()
        with structlog.contextvars.bound_contextvars(request_id=rid):
            try:
                denied = self._denial(scope, headers)
                if denied:
                    await ex.reject(denied, scope["path"])
                elif scope.get("method") == "OPTIONS":
                    await ex.preflight(self.cfg.cors.preflight_headers(
                        origin, _text(headers, b"access-control-request-headers")))
                else:
                    key_scope_var.set(key_scope(scope))
                    await self.app(scope, ex.receive, ex.send)
            except Exception:
                await self._failed(ex, scope["path"])
            finally:
                usage = state.get("usage") or (None, None)
                log.info("request", method=scope.get("method"), route=scope["path"],
                         status=ex.status, ms=round((time.perf_counter() - started) * 1000, 1),
                         prompt_tokens=usage[0], completion_tokens=usage[1])

    def _denial(self, scope: dict, headers: dict[bytes, bytes]) -> MlxcelError | None:
        """The first edge rule the request breaks: Host (403), key (401), type (415).
        A preflight (``OPTIONS``) needs no key: browsers never send one with it."""
        reason = self.cfg.hosts.denial(_text(headers, b"host"))
        if reason:
            return errors.Forbidden(reason)
        if scope.get("method") == "OPTIONS":
            return None
        if self.cfg.api_keys and scope["path"] not in OPEN_PATHS:
            auth = _auth_error(self.cfg.api_keys, _text(headers, b"authorization"),
                               _text(headers, b"x-api-key"))
            if auth:
                return auth
            scope["state"][KEY_SCOPE] = _scope_of(
                self.cfg.api_keys, _text(headers, b"authorization"), _text(headers, b"x-api-key"))
        if scope.get("method") == "POST":
            browser = any(name in headers for name in _BROWSER_HEADERS)
            reason = content_type_denial(_text(headers, b"content-type"), browser,
                                         scope["path"])
            if reason:
                return errors.UnsupportedMediaType(reason)
        return None

    @staticmethod
    async def _failed(ex: _Exchange, path: str) -> None:
        """An exception the app did not turn into a response: after a write timeout it is
        the abandoned response ending; anything else is logged once and, if nothing was
        sent, answered with a 500."""
        if ex.write_timed_out:
            return
        log.exception("unhandled_error")
        if not ex.started:
            try:
                await ex.reject(errors.ServerError(), path)
            except Exception:  # the client is gone; nothing more to tell it
                return
