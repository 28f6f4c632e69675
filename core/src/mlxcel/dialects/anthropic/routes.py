"""Anthropic routes: /v1/messages and /v1/messages/count_tokens (+ unprefixed)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, Response, post

from mlxcel.chat.reasoning import without_thinking
from mlxcel.context import AppContext
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.turn import TurnOptions, budget_of, render, start_turn
from mlxcel.dialects.wire import (
    SSEResponse,
    client_closed,
    decode_body,
    request_priority,
    stream_answer,
)
from mlxcel.types.messages import PromptRequest

from . import schemas as s
from .memory import ThinkingMemory, memory_of
from .stream import MessageEncoder, Tap
from .translate import prompt_request, thinking_budget, thinking_on, turn_options


def _memory(ctx: AppContext, body: s.CountTokensRequest) -> ThinkingMemory | None:
    """The thinking memory, when it applies: thinking on and the prompt cache in use."""
    cached = ctx.engine.prompt_cache.enabled and body.cache_prompt is not False
    return memory_of(ctx) if cached and thinking_on(body) else None


async def _prompt(ctx: AppContext, request: Request, body: s.CountTokensRequest
                  ) -> tuple[PromptRequest, ThinkingMemory | None]:
    """The typed request (assistant turns resent without their thinking get it back from
    the memory, when it applies) and that memory."""
    memory = _memory(ctx, body)
    recall = memory.recall if memory is not None else None
    return await prepare_for(request, lambda: prompt_request(body, recall)), memory


def build(ctx: AppContext) -> list[Any]:
    @post(["/v1/messages", "/messages"], status_code=200)
    async def messages(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, s.MessagesRequest)
        prompt, memory = await _prompt(ctx, request, body)
        rid = f"msg_{uuid.uuid4().hex[:24]}"
        turn = await start_turn(ctx, request, prompt, turn_options(body), rid,
                                priority=request_priority(request))
        encoder = MessageEncoder(rid, ctx.model_name, len(turn.prompt.token_ids),
                                 on_done=memory.remember if memory is not None else None)
        if not body.stream:
            turn.machine = Tap(turn.machine, encoder.add)
            answer = await turn.whole(ctx, request)
            return client_closed() if answer is None else encoder.whole()
        return SSEResponse(stream_answer(request, turn.stream, turn.machine, encoder,
                                         on_finish=turn.on_finish(ctx)))

    @post(["/v1/messages/count_tokens", "/messages/count_tokens"], status_code=200)
    async def count_tokens(request: Request) -> Response:
        """The prompt ``/v1/messages`` would render for this body (system, tools, tool
        choice and thinking included), counted without generating."""
        ctx.require_chat()
        body = await decode_body(request, s.CountTokensRequest)
        prompt, _ = await _prompt(ctx, request, body)
        budget = budget_of(ctx, TurnOptions(reasoning_budget=thinking_budget(body)))
        prompt = msgspec.structs.replace(
            prompt, template_kwargs=without_thinking(prompt.template_kwargs, budget))
        rendered = await render(ctx, request, prompt)
        return Response({"input_tokens": len(rendered.token_ids)})

    return [messages, count_tokens]
