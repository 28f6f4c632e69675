"""OpenAI routes: /v1/chat/completions, /v1/completions (+ unprefixed), /v1/models."""

from __future__ import annotations

import time
import uuid
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.chat.answer import Answer, collect
from mlxcel.chat.output import OutputMachine, answer_machine
from mlxcel.chat.structured import compile_constraint, response_constraint, tool_constraint
from mlxcel.context import AppContext
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.wire import (
    SSEResponse,
    client_closed,
    decode_body,
    record_usage,
    request_priority,
    stream_answer,
    unless_disconnected,
)

from . import schemas as s
from .stream import ChatEncoder, CompletionEncoder
from .translate import (
    chat_prompt_input,
    check_completion_options,
    completion_prompt,
    echo_text,
    generation_request,
)


class _Run:
    """A submitted request: its event stream, its answer's state machine and what every
    response frame repeats."""

    def __init__(self, ctx: AppContext, body: s.SamplingFields, req: Any,
                 machine: OutputMachine) -> None:
        self.started = time.perf_counter()
        self.stream = ctx.engine.submit(req)
        self.machine = machine
        self.tok = ctx.engine.checkpoint.tokenizer
        self.created, self.model = int(time.time()), body.model or ctx.model_name
        self.head = (req.request_id, self.created, self.model, self.tok)

    async def whole(self, ctx: AppContext, request: Request) -> Answer | None:
        """Collect a non-streaming answer (recorded in logs and metrics); None when the
        client left first (the generation is cancelled)."""
        answer = await unless_disconnected(request, collect(self.stream, self.machine),
                                           self.stream.cancel)
        if answer is not None:
            assert answer.finish is not None
            record_usage(request, answer.finish)
            ctx.metrics.record(answer.finish, self.started)
        return answer


async def _guide(ctx: AppContext, constraint: Any) -> Any:
    """The compiled constraint of a structured-output request (None: free generation)."""
    if constraint is None:
        return None
    return await compile_constraint(ctx.constraint_compiler(), constraint)


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
        constraint = response_constraint(body.response_format)
        prompt = await prepare_for(request, lambda: chat_prompt_input(ctx, body))
        markers = ctx.engine.checkpoint.family.reasoning_markers
        constraint = tool_constraint(ctx.engine.checkpoint, prompt, constraint)
        guide = await _guide(ctx, constraint)
        after = markers[1] if guide is not None and markers and prompt.reasoning_open \
            else None
        req = generation_request(ctx, body, list(prompt.token_ids), rid, limit, field,
                                 priority=request_priority(request), logprobs=body.logprobs,
                                 top_logprobs=body.top_logprobs or 0, guide=guide,
                                 guide_after=after)
        run = _Run(ctx, body, req, answer_machine(ctx.engine.checkpoint, req, prompt,
                                                  markers))
        encoder = ChatEncoder(*run.head, include_usage=_include_usage(body),
                              logprobs=body.logprobs)
        if not body.stream:
            answer = await run.whole(ctx, request)
            return client_closed() if answer is None else encoder.whole(answer)
        return SSEResponse(stream_answer(
            request, run.stream, run.machine, encoder,
            on_finish=lambda finish: ctx.metrics.record(finish, run.started)))

    @post(["/v1/completions", "/completions"], status_code=200)
    async def completions(request: Request) -> Any:
        body = await decode_body(request, s.CompletionRequest)
        check_completion_options(body)
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        want = body.logprobs is not None
        constraint = response_constraint(body.response_format)
        prompt = await prepare_for(request, lambda: completion_prompt(ctx, body))
        req = generation_request(ctx, body, prompt, rid, body.max_tokens, "max_tokens",
                                 priority=request_priority(request), logprobs=want,
                                 top_logprobs=body.logprobs or 0,
                                 guide=await _guide(ctx, constraint))
        # streamed completions are not recorded in metrics
        run = _Run(ctx, body, req, OutputMachine(stops=req.stop))
        encoder = CompletionEncoder(*run.head, include_usage=_include_usage(body),
                                    logprobs=want,
                                    echoed=echo_text(ctx, body, prompt) if body.echo else "")
        if not body.stream:
            answer = await run.whole(ctx, request)
            return client_closed() if answer is None else encoder.whole(answer)
        return SSEResponse(stream_answer(request, run.stream, run.machine, encoder))

    @get(["/v1/models", "/models"])
    async def models() -> Response:
        names = ctx.settings.aliases() or (ctx.model_name,)  # --alias a,b: one entry each
        return Response({"object": "list", "data": [
            {"id": name, "object": "model", "created": ctx.created, "owned_by": "user"}
            for name in names
        ]})

    return [chat_completions, completions, models]
