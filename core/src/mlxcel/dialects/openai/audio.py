"""OpenAI's audio routes (and their ``/v1``-less aliases): ``/v1/audio/transcriptions``,
``/v1/audio/translations`` (a Whisper-like ``transcribe`` model, ``--stt-model``) and
``/v1/audio/speech`` (a Kokoro-like ``speak`` model, ``--tts-model``). Without the model a
route answers 501 naming the flag and the distribution, before reading the body."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, post

from mlxcel.context import AppContext
from mlxcel.dialects.wire import SSEResponse, TypedStream, decode_body, error_frame, sse
from mlxcel.errors import InvalidRequest, MlxcelError
from mlxcel.families.speech import Transcription, Utterance
from mlxcel.retrieval import side_model
from mlxcel.speech import encode, jobs, transcripts, upload

MAX_INPUT = 4096
SPEED = (0.25, 4.0)
# the voices OpenAI's speech API names (its SDK requires one)
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse", "marin", "cedar")


class SpeechRequest(msgspec.Struct, kw_only=True):
    input: str
    model: str | None = None
    voice: str | None = None
    speed: float = 1.0
    response_format: str = "wav"
    stream_format: str | None = None
    instructions: str | None = None


def _language(runner: Any, language: str | None) -> str | None:
    if language is None or not language.strip():
        return None
    code = language.strip().lower()
    if code not in runner.languages:
        raise InvalidRequest(f"'language' {language!r} is not one the model knows (ISO-639-1 "
                             "codes such as en, fr, de)", param="language")
    return code


async def transcribe(ctx: AppContext, request: Request, task: str, path: str) -> Any:
    side = side_model(ctx, "transcribe", path)
    req = await upload.read(request)
    fmt = transcripts.check_format(req.response_format)
    runner = side.runner
    if task == "translate" and not getattr(runner, "translates", True):
        raise InvalidRequest("this speech model cannot translate (an English-only model); "
                             "use /v1/audio/transcriptions", param="model")
    if req.granularities and fmt != "verbose_json":
        raise InvalidRequest("'timestamp_granularities' needs 'response_format' "
                             "verbose_json", param="timestamp_granularities")
    words = "word" in req.granularities
    language = _language(runner, req.language) if task == "transcribe" else None
    pcm, seconds = await asyncio.to_thread(upload.decode, req, ctx.plugins.media_decoders,
                                           runner.sample_rate)
    value = Transcription(pcm=pcm, task=task, language=language, prompt=req.prompt,
                          temperature=req.temperature, words=words)
    names = dict(getattr(runner, "language_names", None) or {})
    if req.stream:
        events = jobs.stream(side, value, "transcribe", runner.transcribe)
        first = await anext(events)  # a queue-full or timeout is the response's status
        return SSEResponse(_transcript_events(first, events, seconds))
    result = await jobs.run(side, value, "transcribe", runner.transcribe)
    # the upload's own length: resampling may add a sample the model counts
    result = msgspec.structs.replace(result, duration=seconds)
    body, media_type = transcripts.render(result, fmt, task, names, words)
    return Response(body, media_type=media_type)


async def _transcript_events(first: tuple[str, Any], events: AsyncIterator[tuple[str, Any]],
                             seconds: float) -> AsyncIterator[bytes]:
    """``transcript.text.delta`` per segment, then ``transcript.text.done`` (the whole
    text and its usage), as OpenAI's streamed transcription sends them."""
    async def chained() -> AsyncIterator[tuple[str, Any]]:
        yield first
        async for event in events:
            yield event
    try:
        async for kind, value in chained():
            if kind == "piece":
                yield sse({"type": "transcript.text.delta", "delta": value.text})
            else:
                value = msgspec.structs.replace(value, duration=seconds)
                yield sse({"type": "transcript.text.done", "text": value.text,
                           "usage": transcripts.usage(value)})
    except MlxcelError as exc:
        yield error_frame(exc.message, "server_error")


def _voice(runner: Any, voice: str | None) -> str:
    """The model's voice (or two, mixed) for ``voice``; OpenAI's voice names, which its
    SDK makes every client pass, stand for the model's voice of that name (Kokoro's
    ``af_alloy`` for ``alloy``), else for its default voice."""
    name = (voice or runner.default_voice).strip()
    parts = [_openai_voice(runner, p.strip()) for p in name.split(",")]
    unknown = [p for p in parts if p not in runner.voices]
    if unknown or not 1 <= len(parts) <= 2:
        shown = ", ".join(runner.voices)
        raise InvalidRequest(f"'voice' {name!r} is not a voice of this model (one, or two "
                             f"joined by a comma to mix them; or one of OpenAI's voice "
                             f"names); available: {shown}", param="voice")
    return ",".join(parts)


def _openai_voice(runner: Any, name: str) -> str:
    if name in runner.voices or name.lower() not in OPENAI_VOICES:
        return name
    named = sorted(v for v in runner.voices if v.rpartition("_")[2] == name.lower())
    return named[0] if named else runner.default_voice


async def speak(ctx: AppContext, request: Request, path: str) -> Any:
    side = side_model(ctx, "speak", path)
    body = await decode_body(request, SpeechRequest)
    text = body.input
    if not text.strip():
        raise InvalidRequest("'input' is empty", param="input")
    if len(text) > MAX_INPUT:
        raise InvalidRequest(f"'input' has {len(text)} characters, over the limit of "
                             f"{MAX_INPUT}", param="input")
    if not SPEED[0] <= body.speed <= SPEED[1]:
        raise InvalidRequest(f"'speed' must be between {SPEED[0]} and {SPEED[1]}",
                             param="speed")
    if body.stream_format not in (None, "audio", "sse"):
        raise InvalidRequest("'stream_format' must be audio or sse", param="stream_format")
    fmt = encode.check_format(body.response_format)
    runner = side.runner
    value = Utterance(text=text, voice=_voice(runner, body.voice), speed=body.speed)
    events = jobs.stream(side, value, "speak", runner.speak)
    first = await anext(events)  # a queue-full or timeout is the response's status

    async def chunks() -> AsyncIterator[Any]:
        kind, value = first
        if kind == "piece":
            yield value
        async for kind, value in events:
            if kind == "piece":
                yield value

    audio = encode.encoded(chunks(), fmt, runner.sample_rate)
    if body.stream_format == "sse":
        return SSEResponse(_speech_events(audio, len(text)))
    return TypedStream(audio, encode.MEDIA_TYPES[fmt])


async def _speech_events(audio: AsyncIterator[bytes], chars: int) -> AsyncIterator[bytes]:
    try:
        async for part in audio:
            yield sse({"type": "speech.audio.delta",
                       "audio": base64.b64encode(part).decode("ascii")})
        yield sse({"type": "speech.audio.done",
                   "usage": {"input_tokens": chars, "output_tokens": 0,
                             "total_tokens": chars}})
    except MlxcelError as exc:
        yield error_frame(exc.message, "server_error")


def build(ctx: AppContext) -> list[Any]:
    @post(["/v1/audio/transcriptions", "/audio/transcriptions"], status_code=200)
    async def transcriptions(request: Request) -> Any:
        return await transcribe(ctx, request, "transcribe", "/v1/audio/transcriptions")

    @post(["/v1/audio/translations", "/audio/translations"], status_code=200)
    async def translations(request: Request) -> Any:
        return await transcribe(ctx, request, "translate", "/v1/audio/translations")

    @post(["/v1/audio/speech", "/audio/speech"], status_code=200)
    async def speech(request: Request) -> Any:
        return await speak(ctx, request, "/v1/audio/speech")

    return [transcriptions, translations, speech]
