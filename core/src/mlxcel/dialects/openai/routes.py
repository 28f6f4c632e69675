"""OpenAI routes: /v1/chat/completions, /v1/completions (+ unprefixed), /v1/models."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.context import AppContext
from mlxcel.dialects.wire import SSE_DONE, SSEResponse, decode_body, request_priority, sse
from mlxcel.engine.client import EventStream
from mlxcel.types import GenerationEvent, TokenLogprob

from . import schemas as s
from .logprobs import chat_logprobs, completion_logprobs
from .translate import chat_prompt, completion_prompt, generation_request

FINISH = {"stop": "stop", "length": "length", "error": "error", "cancelled": "stop"}
# frame(text, finish_reason, logprobs of the tokens behind this text)
Frame = Callable[[str, str | None, tuple[TokenLogprob, ...]], Any]


def _usage(event: GenerationEvent) -> s.Usage:
    u = event.usage
    assert u is not None
    return s.Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens,
                   {"cached_tokens": u.cached_tokens})


async def _collect(stream: EventStream) -> tuple[str, list[TokenLogprob], GenerationEvent]:
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    async for event in stream:
        parts.append(event.text)
        logprobs.extend(event.logprobs)
        if event.finish_reason is not None:
            return "".join(parts), logprobs, event
    raise RuntimeError("engine stream ended without a finish event")


def _record(request: Request, event: GenerationEvent) -> None:
    if event.usage is not None:
        request.scope["state"]["usage"] = (event.usage.prompt_tokens,
                                           event.usage.completion_tokens)


async def _sse(request: Request, stream: EventStream, frame: Frame,
               usage_frame: Callable[[s.Usage], Any] | None, first: Any = None,
               on_finish: Callable[[GenerationEvent], None] | None = None
               ) -> AsyncIterator[bytes]:
    """Content frames (also empty ones that carry logprobs), a finish frame, the usage frame
    when asked, then ``[DONE]``. ``on_finish`` never runs when the client left before it."""
    try:
        if first is not None:
            yield sse(first)
        async for first_event in stream:
            # events that arrived together go out in one write (fewer sends under load)
            out: list[bytes] = []
            for event in [first_event, *stream.take_ready()]:
                if event.text or event.logprobs:
                    out.append(sse(frame(event.text, None, event.logprobs)))
                if event.finish_reason is None:
                    continue
                _record(request, event)
                if on_finish is not None:
                    on_finish(event)
                out.append(sse(frame("", FINISH[event.finish_reason], ())))
                if usage_frame is not None:
                    out.append(sse(usage_frame(_usage(event))))
                out.append(SSE_DONE)
            if out:
                yield b"".join(out)
    finally:
        stream.cancel()  # no-op when finished; frees the slot when the client went away


class _Run:
    """A submitted request: its event stream and what every response frame repeats."""

    def __init__(self, ctx: AppContext, body: s.SamplingFields, req: Any) -> None:
        self.started = time.perf_counter()
        self.stream = ctx.engine.submit(req)
        self.tok = ctx.engine.checkpoint.tokenizer
        self.created, self.model = int(time.time()), body.model or ctx.model_name

    async def whole(self, ctx: AppContext, request: Request
                    ) -> tuple[str, list[TokenLogprob], GenerationEvent]:
        """Collect a non-streaming response (recorded in logs and metrics)."""
        text, lps, last = await _collect(self.stream)
        _record(request, last)
        ctx.metrics.record(last, self.started)
        return text, lps, last


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
        req = generation_request(ctx, body, chat_prompt(ctx, body), rid, limit, field,
                                 priority=request_priority(request), logprobs=body.logprobs,
                                 top_logprobs=body.top_logprobs or 0)
        run = _Run(ctx, body, req)
        created, model, tok = run.created, run.model, run.tok
        if not body.stream:
            text, lps, last = await run.whole(ctx, request)
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
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        want = body.logprobs is not None
        req = generation_request(ctx, body, completion_prompt(ctx, body), rid,
                                 body.max_tokens, "max_tokens",
                                 priority=request_priority(request), logprobs=want,
                                 top_logprobs=body.logprobs or 0)
        run = _Run(ctx, body, req)  # streamed completions are not recorded in metrics
        created, model, tok = run.created, run.model, run.tok
        if not body.stream:
            text, lps, last = await run.whole(ctx, request)
            choice = s.CompletionChoice(0, text, FINISH[last.finish_reason],
                                        completion_logprobs(tok, lps) if want else None)
            return s.Completion(rid, created, model, [choice], usage=_usage(last))
        offset = [0]

        def frame(text: str, finish: str | None, lps: tuple) -> s.Completion:
            logprobs = completion_logprobs(tok, lps, offset[0]) if lps else None
            offset[0] += len(text)
            return s.Completion(rid, created, model,
                                [s.CompletionChoice(0, text, finish, logprobs)])

        def usage_frame(usage: s.Usage) -> s.Completion:
            return s.Completion(rid, created, model, [], usage=usage)

        return SSEResponse(_sse(request, run.stream, frame,
                                usage_frame if _include_usage(body) else None))

    @get(["/v1/models", "/models"])
    async def models() -> Response:
        return Response({"object": "list", "data": [
            {"id": ctx.model_name, "object": "model", "created": ctx.created, "owned_by": "user"}
        ]})

    return [chat_completions, completions, models]
