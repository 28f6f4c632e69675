"""OpenAI routes: /v1/chat/completions, /v1/completions (+ unprefixed), /v1/models."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.context import AppContext
from mlxcel.dialects.wire import SSE_DONE, SSEResponse, decode_body, sse
from mlxcel.engine.client import EventStream
from mlxcel.types import GenerationEvent

from . import schemas as s
from .translate import chat_prompt, completion_prompt, generation_request

FINISH = {"stop": "stop", "length": "length", "error": "error", "cancelled": "stop"}


def _usage(event: GenerationEvent) -> s.Usage:
    u = event.usage
    assert u is not None
    return s.Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens)


async def _collect(stream: EventStream) -> tuple[str, GenerationEvent]:
    parts: list[str] = []
    async for event in stream:
        parts.append(event.text)
        if event.finish_reason is not None:
            return "".join(parts), event
    raise RuntimeError("engine stream ended without a finish event")


def _record(request: Request, event: GenerationEvent) -> None:
    if event.usage is not None:
        request.scope["state"]["usage"] = (event.usage.prompt_tokens,
                                           event.usage.completion_tokens)


async def _sse(request: Request, stream: EventStream, frame: Callable[[str, str | None], Any],
               usage_frame: Callable[[s.Usage], Any] | None, first: Any = None,
               on_finish: Callable[[GenerationEvent], None] | None = None
               ) -> AsyncIterator[bytes]:
    """``on_finish`` sees the finish event (never called when the client left before it)."""
    try:
        if first is not None:
            yield sse(first)
        async for event in stream:
            if event.finish_reason is None:
                if event.text:
                    yield sse(frame(event.text, None))
                continue
            _record(request, event)
            if on_finish is not None:
                on_finish(event)
            if event.text:
                yield sse(frame(event.text, None))
            yield sse(frame("", FINISH[event.finish_reason]))
            if usage_frame is not None:
                yield sse(usage_frame(_usage(event)))
            yield SSE_DONE
    finally:
        stream.cancel()  # no-op when finished; frees the slot when the client went away


def build(ctx: AppContext) -> list[Any]:
    engine = ctx.engine

    @post(["/v1/chat/completions", "/chat/completions"], status_code=200)
    async def chat_completions(request: Request) -> Any:
        body = await decode_body(request, s.ChatCompletionRequest)
        limit, field = ((body.max_completion_tokens, "max_completion_tokens")
                        if body.max_completion_tokens is not None else (body.max_tokens,
                                                                        "max_tokens"))
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        req = generation_request(ctx, body, chat_prompt(ctx, body), rid, limit, field)
        started = time.perf_counter()
        stream = engine.submit(req)
        created, model = int(time.time()), body.model or ctx.model_name
        if not body.stream:
            text, last = await _collect(stream)
            _record(request, last)
            ctx.metrics.record(last, started)
            choice = s.ChatChoice(0, s.AssistantMessage(content=text), FINISH[last.finish_reason])
            return s.ChatCompletion(rid, created, model, [choice], _usage(last))

        def frame(text: str, finish: str | None) -> s.ChatCompletionChunk:
            delta = s.Delta(content=text) if finish is None else s.Delta()
            return s.ChatCompletionChunk(rid, created, model, [s.ChunkChoice(0, delta, finish)])

        def usage_frame(usage: s.Usage) -> s.ChatCompletionChunk:
            return s.ChatCompletionChunk(rid, created, model, [], usage=usage)

        include = body.stream_options is not None and body.stream_options.include_usage
        role = s.ChatCompletionChunk(rid, created, model,
                                     [s.ChunkChoice(0, s.Delta(role="assistant"))])
        return SSEResponse(_sse(request, stream, frame, usage_frame if include else None, role,
                                on_finish=lambda event: ctx.metrics.record(event, started)))

    @post(["/v1/completions", "/completions"], status_code=200)
    async def completions(request: Request) -> Any:
        body = await decode_body(request, s.CompletionRequest)
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        req = generation_request(ctx, body, completion_prompt(ctx, body), rid,
                                 body.max_tokens, "max_tokens")
        started = time.perf_counter()
        stream = engine.submit(req)
        created, model = int(time.time()), body.model or ctx.model_name
        if not body.stream:
            text, last = await _collect(stream)
            _record(request, last)
            ctx.metrics.record(last, started)  # streamed completions are not recorded
            choice = s.CompletionChoice(0, text, FINISH[last.finish_reason])
            return s.Completion(rid, created, model, [choice], usage=_usage(last))

        def frame(text: str, finish: str | None) -> s.Completion:
            return s.Completion(rid, created, model, [s.CompletionChoice(0, text, finish)])

        def usage_frame(usage: s.Usage) -> s.Completion:
            return s.Completion(rid, created, model, [], usage=usage)

        include = body.stream_options is not None and body.stream_options.include_usage
        return SSEResponse(_sse(request, stream, frame, usage_frame if include else None))

    @get(["/v1/models", "/models"])
    async def models() -> Response:
        return Response({"object": "list", "data": [
            {"id": ctx.model_name, "object": "model", "created": ctx.created, "owned_by": "user"}
        ]})

    return [chat_completions, completions, models]
