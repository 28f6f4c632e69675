"""Helpers every dialect uses: decode a JSON body into a msgspec struct, SSE framing, the
loop that drives an answer's events through the chat layer into a dialect's frames."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from mlxcel.chat.output import OutputMachine
from mlxcel.dialects.jsondepth import MAX_JSON_DEPTH, deep_path, too_deep
from mlxcel.dialects.prepare import prepare
from mlxcel.errors import InvalidRequest
from mlxcel.types import Delta, Finish

T = TypeVar("T")
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_encoder = msgspec.json.Encoder()


_MISSING = re.compile(r"missing required field `([^`]+)`")


def _field(message: str) -> str | None:
    """The field a validation message names: its path, else the missing field."""
    match = _PATH.search(message)
    if match and match.group(1):
        return match.group(1)
    missing = _MISSING.search(message)
    return missing.group(1) if missing else None


def _flatten_extra_body(data: Any) -> Any:
    """Fields sent inside a literal ``extra_body`` object count as top-level fields
    (the top-level value wins), as when the OpenAI SDK's extra_body is sent verbatim."""
    if isinstance(data, dict) and isinstance(data.get("extra_body"), dict):
        return {**data["extra_body"], **data}
    return data


def _too_deep(path: str | None) -> InvalidRequest:
    where = f" (field '{path}')" if path else ""
    return InvalidRequest(f"JSON nested more than {MAX_JSON_DEPTH} levels deep{where}",
                          param=path)


def _decode_json(body: bytes) -> Any:
    """Parsed JSON no deeper than ``MAX_JSON_DEPTH`` (else a 400 naming where)."""
    try:
        data = msgspec.json.decode(body)
    except RecursionError:
        raise _too_deep(deep_path(body)) from None
    deep, path = too_deep(data)
    if deep:
        raise _too_deep(path)
    return data


async def decode_body(request: Request, type_: type[T]) -> T:
    """Decode the request body (off the event loop when large); any problem is a 400 that
    names the field."""
    body = await request.body()
    if not body.strip():
        raise InvalidRequest("request body is empty; send a JSON object")
    return await prepare(len(body), lambda: _parse(body, type_))


def _parse(body: bytes, type_: type[T]) -> T:
    try:
        data = _flatten_extra_body(_decode_json(body))
        return msgspec.convert(data, type=type_)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = _field(text)
        where = f" (field '{field}')" if field else ""
        raise InvalidRequest(f"invalid request{where}: {text}", param=field) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None


CLIENT_CLOSED = 499  # nginx's "client closed request": logged, never seen by the client


async def _disconnect(request: Request) -> None:
    """Return when the client goes away (the body was read: only ``http.disconnect`` is
    left to arrive on the ASGI receive channel)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T], cancel: Any) -> T | None:
    """``await work`` while watching for the client to leave; if it leaves first,
    ``cancel()`` and None, so that a non-streaming request stops generating for nobody."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((job, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        left = not job.done()
        if left:  # the client went away (or this handler was cancelled)
            job.cancel()
            cancel()
    return None if left else job.result()


def client_closed() -> Response:
    """What a handler returns for a client that left (nothing reaches it)."""
    return Response(b"", status_code=CLIENT_CLOSED)


def error_frame(message: str, type_: str = "server_error") -> bytes:
    """An SSE frame in the OpenAI error shape (the SDK raises ``APIError`` on it)."""
    return sse({"error": {"message": message, "type": type_, "code": None}})


def sse(payload: Any) -> bytes:
    """One Server-Sent Events ``data:`` frame."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(Stream):
    """An SSE response whose content type survives a handler's default (JSON) media type."""

    def __init__(self, content, **kwargs: Any) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={**SSE_HEADERS, **kwargs.pop("headers", {})}, **kwargs)

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = "text/event-stream"
        return super().to_asgi_response(*args, **kwargs)


class TypedStream(Stream):
    """A streamed body of ``media_type`` (audio), kept over a handler's default (JSON)."""

    def __init__(self, content: Any, media_type: str, **kwargs: Any) -> None:
        super().__init__(content, media_type=media_type, **kwargs)
        self.kept_type = media_type

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = self.kept_type
        return super().to_asgi_response(*args, **kwargs)


PRIORITY_LANES = {"high": 0, "normal": 1, "low": 2}


def request_priority(request: Request) -> int:
    """The prefill lane from the ``X-Priority`` header: high, normal (default) or low."""
    raw = request.headers.get("x-priority")
    if raw is None:
        return PRIORITY_LANES["normal"]
    lane = PRIORITY_LANES.get(raw.strip().lower())
    if lane is None:
        raise InvalidRequest("header 'X-Priority' must be high, normal or low",
                             param="X-Priority")
    return lane


class StreamEncoder(Protocol):
    """A dialect's frames for one streamed answer (``first``: what opens the stream)."""

    def first(self) -> bytes | None: ...

    def encode(self, deltas: list[Delta]) -> list[bytes]: ...


def record_usage(request: Request, finish: Finish) -> None:
    """Token counts for the access log (``middleware``)."""
    if finish.usage is not None:
        request.scope["state"]["usage"] = (finish.usage.prompt_tokens,
                                           finish.usage.completion_tokens)


async def stream_answer(request: Request, stream: Any, machine: OutputMachine,
                        encoder: StreamEncoder,
                        on_finish: Callable[[Finish], None] | None = None
                        ) -> AsyncIterator[bytes]:
    """An answer's frames as its events arrive: events that arrived together go out in one
    write (fewer sends under load). ``on_finish`` runs for an answer that ended well, and
    never when the client left before its end; leaving cancels the generation."""
    try:
        first = encoder.first()
        if first:
            yield first
        async for first_event in stream:
            out: list[bytes] = []
            for event in [first_event, *stream.take_ready()]:
                if event.progress is not None:  # a prefill chunk's (``return_progress``)
                    progress = getattr(encoder, "progress", None)
                    out.extend(progress(event.progress) if progress is not None else ())
                    continue
                deltas = machine.feed(event)
                finish = deltas[-1] if deltas and isinstance(deltas[-1], Finish) else None
                if finish is not None and finish.ok:
                    record_usage(request, finish)
                    if on_finish is not None:
                        on_finish(finish)
                out.extend(encoder.encode(deltas))
            if out:
                yield b"".join(out)
    finally:
        stream.cancel()  # no-op when finished; frees the slot when the client went away
