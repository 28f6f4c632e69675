"""OpenAI routes: /v1/chat/completions, /v1/completions (+ unprefixed), /v1/models."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.context import AppContext
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.wire import (
    SSE_DONE,
    SSEResponse,
    client_closed,
    decode_body,
    error_frame,
    request_priority,
    sse,
    unless_disconnected,
)
from mlxcel.engine.client import EventStream
from mlxcel.errors import GenerationFailed
from mlxcel.types import GenerationEvent, TokenLogprob

from . import schemas as s
from .logprobs import chat_logprobs, completion_logprobs
from .translate import (
    chat_prompt,
    check_completion_options,
    completion_prompt,
    echo_text,
    generation_request,
)

# engine finish reasons -> OpenAI's; "error" and "cancelled" never reach a client as a finish
FINISH = {"stop": "stop", "length": "length"}
# frame(text, finish_reason, logprobs of the tokens behind this text)
Frame = Callable[[str, str | None, tuple[TokenLogprob, ...]], Any]


def _usage(event: GenerationEvent) -> s.Usage:
    u = event.usage
    assert u is not None
    return s.Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens,
                   {"cached_tokens": u.cached_tokens})


def _failure(event: GenerationEvent) -> str:
    if event.finish_reason == "cancelled":
        return "the generation was cancelled"
    return event.error or "the generation failed"


async def _collect(stream: EventStream) -> tuple[str, list[TokenLogprob], GenerationEvent]:
    """The whole generation; an engine failure is a 500 carrying the engine's message."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    async for event in stream:
        parts.append(event.text)
        logprobs.extend(event.logprobs)
        if event.finish_reason in FINISH:
            return "".join(parts), logprobs, event
        if event.finish_reason is not None:
            raise GenerationFailed(_failure(event))
    raise GenerationFailed("the engine stream ended without a finish event")


def _record(request: Request, event: GenerationEvent) -> None:
    if event.usage is not None:
        request.scope["state"]["usage"] = (event.usage.prompt_tokens,
                                           event.usage.completion_tokens)


async def _sse(request: Request, stream: EventStream, frame: Frame,
               usage_frame: Callable[[s.Usage], Any] | None, first: Any = None,
               on_finish: Callable[[GenerationEvent], None] | None = None
               ) -> AsyncIterator[bytes]:
    """Content frames (also empty ones that carry logprobs), a finish frame, the usage frame
    when asked, then ``[DONE]``; an engine failure ends it with an error frame and
    ``[DONE]``. ``on_finish`` never runs when the client left before it."""
    try:
        if first is not None:
            yield sse(first)
        async for first_event in stream:
            # events that arrived together go out in one write (fewer sends under load)
            out: list[bytes] = []
            for event in [first_event, *stream.take_ready()]:
                if event.text or event.logprobs:
                    out.append(sse(frame(event.text, None, event.logprobs)))
                if event.finish_reason is not None:
                    out.extend(_closing(request, event, frame, usage_frame, on_finish))
            if out:
                yield b"".join(out)
    finally:
        stream.cancel()  # no-op when finished; frees the slot when the client went away


def _closing(request: Request, event: GenerationEvent, frame: Frame,
             usage_frame: Callable[[s.Usage], Any] | None,
             on_finish: Callable[[GenerationEvent], None] | None) -> list[bytes]:
    """The frames after the last content: finish (+ usage) and ``[DONE]``, or an error
    frame and ``[DONE]`` when the engine failed the row."""
    if event.finish_reason not in FINISH:
        return [error_frame(_failure(event)), SSE_DONE]
    _record(request, event)
    if on_finish is not None:
        on_finish(event)
    out = [sse(frame("", FINISH[event.finish_reason], ()))]
    if usage_frame is not None:
        out.append(sse(usage_frame(_usage(event))))
    return [*out, SSE_DONE]


class _Run:
    """A submitted request: its event stream and what every response frame repeats."""

    def __init__(self, ctx: AppContext, body: s.SamplingFields, req: Any) -> None:
        self.started = time.perf_counter()
        self.stream = ctx.engine.submit(req)
        self.tok = ctx.engine.checkpoint.tokenizer
        self.created, self.model = int(time.time()), body.model or ctx.model_name

    async def whole(self, ctx: AppContext, request: Request
                    ) -> tuple[str, list[TokenLogprob], GenerationEvent] | None:
        """Collect a non-streaming response (recorded in logs and metrics); None when the
        client left first (the generation is cancelled)."""
        result = await unless_disconnected(request, _collect(self.stream), self.stream.cancel)
        if result is not None:
            _record(request, result[2])
            ctx.metrics.record(result[2], self.started)
        return result


def _include_usage(body: s.SamplingFields) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def build(ctx: AppContext) -> list[Any]:
    @post(["/v1/chat/completions", "/chat/completions"], status_code=200)
    async def chat_completions(request: Request) -> Any:
        body = await decode_body(request, s.ChatCompletionRequest)
        limit, field = ((body.max_completion_tokens, "max_completion_tokens")
                        if body.max_completion_tokens is not None else (body.max_tokens,
                                                                        "max_tokens"))
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        prompt = await prepare_for(request, lambda: chat_prompt(ctx, body))
        req = generation_request(ctx, body, prompt, rid, limit, field,
                                 priority=request_priority(request), logprobs=body.logprobs,
                                 top_logprobs=body.top_logprobs or 0)
        run = _Run(ctx, body, req)
        created, model, tok = run.created, run.model, run.tok
        if not body.stream:
            result = await run.whole(ctx, request)
            if result is None:
                return client_closed()
            text, lps, last = result
            choice = s.ChatChoice(0, s.AssistantMessage(content=text), FINISH[last.finish_reason],
                                  chat_logprobs(tok, lps) if body.logprobs else None)
            return s.ChatCompletion(rid, created, model, [choice], _usage(last))

        def frame(text: str, finish: str | None, lps: tuple) -> s.ChatCompletionChunk:
            delta = s.Delta(content=text) if finish is None else s.Delta()
            logprobs = chat_logprobs(tok, lps) if lps else None
            return s.ChatCompletionChunk(rid, created, model,
                                         [s.ChunkChoice(0, delta, finish, logprobs)])

        def usage_frame(usage: s.Usage) -> s.ChatCompletionChunk:
            return s.ChatCompletionChunk(rid, created, model, [], usage=usage)

        role = s.ChatCompletionChunk(rid, created, model,
                                     [s.ChunkChoice(0, s.Delta(role="assistant"))])
        return SSEResponse(_sse(request, run.stream, frame,
                                usage_frame if _include_usage(body) else None, role,
                                on_finish=lambda event: ctx.metrics.record(event, run.started)))

    @post(["/v1/completions", "/completions"], status_code=200)
    async def completions(request: Request) -> Any:
        body = await decode_body(request, s.CompletionRequest)
        check_completion_options(body)
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        want = body.logprobs is not None
        prompt = await prepare_for(request, lambda: completion_prompt(ctx, body))
        req = generation_request(ctx, body, prompt, rid, body.max_tokens, "max_tokens",
                                 priority=request_priority(request), logprobs=want,
                                 top_logprobs=body.logprobs or 0)
        run = _Run(ctx, body, req)  # streamed completions are not recorded in metrics
        created, model, tok = run.created, run.model, run.tok
        echoed = echo_text(ctx, body, prompt) if body.echo else ""
        if not body.stream:
            result = await run.whole(ctx, request)
            if result is None:
                return client_closed()
            text, lps, last = result
            choice = s.CompletionChoice(0, echoed + text, FINISH[last.finish_reason],
                                        completion_logprobs(tok, lps) if want else None)
            return s.Completion(rid, created, model, [choice], usage=_usage(last))
        offset = [len(echoed)]

        def frame(text: str, finish: str | None, lps: tuple) -> s.Completion:
            logprobs = completion_logprobs(tok, lps, offset[0]) if lps else None
            offset[0] += len(text)
            return s.Completion(rid, created, model,
                                [s.CompletionChoice(0, text, finish, logprobs)])

        def usage_frame(usage: s.Usage) -> s.Completion:
            return s.Completion(rid, created, model, [], usage=usage)

        first = s.Completion(rid, created, model, [s.CompletionChoice(0, echoed, None)]) \
            if echoed else None
        return SSEResponse(_sse(request, run.stream, frame,
                                usage_frame if _include_usage(body) else None, first))

    @get(["/v1/models", "/models"])
    async def models() -> Response:
        return Response({"object": "list", "data": [
            {"id": ctx.model_name, "object": "model", "created": ctx.created, "owned_by": "user"}
        ]})

    return [chat_completions, completions, models]
