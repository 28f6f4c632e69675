"""A transcription request's fields and audio, from a multipart upload (the OpenAI SDK's
``file``) or a JSON body (``file`` as base64 or a ``data:`` URI), checked and decoded.

Limits (the spec's): 25 MiB of upload (413), then what the audio decoders check on the
stream's header (600 s, 8 channels, 192 kHz); a file no decoder reads is a 400 naming its
format.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec
from litestar import Request

from mlxcel.errors import InvalidRequest, PayloadTooLarge
from mlxcel.media.api import MediaLimits
from mlxcel.media.audio import resample
from mlxcel.media.decode import decode_media
from mlxcel.types.media import MediaBlob

MAX_UPLOAD = 25 << 20
_FIELDS = ("model", "language", "prompt", "response_format", "temperature", "stream")


class AudioRequest(msgspec.Struct, kw_only=True):
    """The fields every transcription and translation takes, as sent."""

    data: bytes
    mime: str = ""
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float = 0.0
    stream: bool = False
    granularities: tuple[str, ...] = ()


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the audio file is larger than {MAX_UPLOAD >> 20} MiB",
                           param="file")


async def read(request: Request) -> AudioRequest:
    """The request's fields and file bytes, multipart or JSON."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > MAX_UPLOAD + (1 << 20):
        raise _too_large()
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _multipart(request)
    return _json(await request.body())


async def _multipart(request: Request) -> AudioRequest:
    form = await request.form()
    upload = form.get("file")
    if upload is None or not hasattr(upload, "read"):
        raise InvalidRequest("'file' is required: the audio file to transcribe", param="file")
    data = await upload.read()
    fields: dict[str, Any] = {k: form.get(k) for k in _FIELDS if form.get(k) is not None}
    grains = form.getall("timestamp_granularities[]", []) or \
        form.getall("timestamp_granularities", [])
    return _checked(data, getattr(upload, "content_type", "") or "", fields, grains)


def _json(raw: bytes) -> AudioRequest:
    try:
        body = msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError:
        raise InvalidRequest("the body is neither multipart/form-data nor valid JSON") \
            from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    source = body.get("file", body.get("audio"))
    if not isinstance(source, str) or not source:
        raise InvalidRequest("'file' is required: the audio as base64 or a data: URI",
                             param="file")
    mime = ""
    if source.startswith("data:"):
        head, _, source = source.partition(",")
        mime = head[5:].split(";")[0]
    if len(source) > MAX_UPLOAD * 4 // 3 + 8:
        raise _too_large()
    try:
        data = base64.b64decode(source, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("'file' is not valid base64", param="file") from None
    grains = body.get("timestamp_granularities") or body.get("timestamp_granularities[]") or []
    return _checked(data, mime, {k: body[k] for k in _FIELDS if body.get(k) is not None},
                    grains if isinstance(grains, list) else [grains])


def _checked(data: bytes, mime: str, fields: dict[str, Any], grains: list[Any]
             ) -> AudioRequest:
    if len(data) > MAX_UPLOAD:
        raise _too_large()
    if not data:
        raise InvalidRequest("'file' is empty", param="file")
    try:
        temperature = float(fields.pop("temperature", 0.0))
    except (TypeError, ValueError):
        raise InvalidRequest("'temperature' must be a number", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise InvalidRequest("'temperature' must be between 0 and 1", param="temperature")
    stream = fields.pop("stream", False)
    if isinstance(stream, str):
        stream = stream.strip().lower() in ("true", "1", "yes")
    for key in ("model", "language", "prompt", "response_format"):
        if key in fields and not isinstance(fields[key], str):
            raise InvalidRequest(f"'{key}' must be a string", param=key)
    bad = [g for g in grains if g not in ("segment", "word")]
    if bad:
        raise InvalidRequest("'timestamp_granularities' may hold 'segment' and 'word' only",
                             param="timestamp_granularities")
    return AudioRequest(data=data, mime=mime, temperature=temperature, stream=bool(stream),
                        granularities=tuple(grains), **fields)


def decode(req: AudioRequest, registry: Any, rate: int) -> Any:
    """The upload as mono float32 PCM at ``rate`` (CPU work: call it off the loop)."""
    item = decode_media(MediaBlob.of(req.data, req.mime, "data"), "audio", registry,
                        MediaLimits(), "file")
    return resample(item, rate), item.pcm.shape[0] / item.sample_rate
