"""Helpers every dialect uses: decode a JSON body into a msgspec struct, SSE framing."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.response import Stream

from mlxcel.errors import InvalidRequest

T = TypeVar("T")
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_encoder = msgspec.json.Encoder()


def _field(message: str) -> str | None:
    match = _PATH.search(message)
    return match.group(1) or None if match else None


def _flatten_extra_body(data: Any) -> Any:
    """Fields sent inside a literal ``extra_body`` object count as top-level fields
    (the top-level value wins), as when the OpenAI SDK's extra_body is sent verbatim."""
    if isinstance(data, dict) and isinstance(data.get("extra_body"), dict):
        return {**data["extra_body"], **data}
    return data


async def decode_body(request: Request, type_: type[T]) -> T:
    """Decode the request body; any problem is a 400 that names the field."""
    body = await request.body()
    if not body.strip():
        raise InvalidRequest("request body is empty; send a JSON object")
    try:
        data = _flatten_extra_body(msgspec.json.decode(body))
        return msgspec.convert(data, type=type_)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = _field(text)
        where = f" (field '{field}')" if field else ""
        raise InvalidRequest(f"invalid request{where}: {text}", param=field) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None


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
