"""OpenAI routes: /v1/chat/completions (+ unprefixed), /v1/completions, /v1/models (+
unprefixed), /v1/embeddings, and the OpenAI routes of side models not built yet. The
unprefixed /completions is llama-server's native route (``dialects.llamacpp``), as in
llama-server."""

from __future__ import annotations

import time
import uuid
from typing import Any

from litestar import Request, Response, get, post

from mlxcel.chat.lazy_grammar import lazy_start_of
from mlxcel.chat.output import OutputMachine
from mlxcel.chat.structured import compile_constraint, request_constraint
from mlxcel.context import CAPABILITIES, AppContext
from mlxcel.dialects.choices import Choices
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.turn import Turn, generation_request, start_turn
from mlxcel.dialects.unserved import unserved_routes
from mlxcel.dialects.wire import (
    decode_body,
    request_priority,
)
from mlxcel.errors import MlxcelError
from mlxcel.families.media import media_kinds
from mlxcel.types.messages import PromptInput

from . import audio, embeddings, images
from . import schemas as s
from .answers import answer
from .stream import ChatEncoder, CompletionEncoder
from .translate import (
    check_completion_options,
    completion_prompt,
    echo_text,
    prompt_request,
    turn_options,
)

UNSERVED = (("GET", "a Nemotron VoiceChat checkpoint", ("/v1/realtime",)),)


def _head(ctx: AppContext, body: s.SamplingFields, rid: str) -> tuple[Any, ...]:
    """What every response frame repeats: id, created, model, tokenizer."""
    return (rid, int(time.time()), body.model or ctx.model_name, ctx.checkpoint.tokenizer)


def _include_usage(body: s.SamplingFields) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def chat_capabilities(ctx: AppContext) -> list[str]:
    """The chat model's ``capabilities`` entry: ``completion``, and ``multimodal`` where
    it takes media (llama-server's word, which its clients check before sending images);
    while it loads, ``completion`` only."""
    try:
        kinds = media_kinds(ctx.checkpoint.model)
    except MlxcelError:
        kinds = ()
    return ["completion", "multimodal"] if kinds else ["completion"]


def build(ctx: AppContext) -> list[Any]:
    @post(["/v1/chat/completions", "/chat/completions"], status_code=200)
    async def chat_completions(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, s.ChatCompletionRequest)
        limit, field = ((body.max_completion_tokens, "max_completion_tokens")
                        if body.max_completion_tokens is not None else (body.max_tokens,
                                                                        "max_tokens"))
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        response = request_constraint(body.response_format, grammar=body.grammar,
                                      json_schema=body.json_schema, tools=bool(body.tools))
        options = turn_options(body, limit, field, logprobs=body.logprobs,
                               top_logprobs=body.top_logprobs or 0, response=response,
                               lazy=lazy_start_of(body, ctx.checkpoint.tokenizer, response))
        chat = await prepare_for(request, lambda: prompt_request(body))
        turn = await start_turn(ctx, request, chat, options, rid,
                                priority=request_priority(request))
        head = _head(ctx, body, rid)
        return await answer(ctx, request, turn, lambda i, last, timed: ChatEncoder(
            *head, include_usage=_include_usage(body), logprobs=body.logprobs, index=i,
            last=last, timed=timed, verbose=ctx.settings.verbose), stream=body.stream,
            timings=body.timings_per_token)

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Any:
        ctx.require_chat()
        body = await decode_body(request, s.CompletionRequest)
        check_completion_options(body)
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        want = body.logprobs is not None
        response = request_constraint(body.response_format, grammar=body.grammar,
                                      json_schema=body.json_schema)
        options = turn_options(body, body.max_tokens, "max_tokens", logprobs=want,
                               top_logprobs=body.logprobs or 0, response=response,
                               lazy=lazy_start_of(body, ctx.checkpoint.tokenizer, response))
        prompt = await prepare_for(request, lambda: completion_prompt(ctx, body))
        guide = None if options.response is None else await compile_constraint(
            ctx.constraint_compiler(), options.response)
        req = generation_request(ctx, prompt, rid, options,
                                 priority=request_priority(request), guide=guide)
        rendered = PromptInput(token_ids=tuple(prompt))
        turn = Choices(ctx, rendered, req, options.n,
                       machine=lambda r: OutputMachine(stops=r.stop)) if options.n > 1 \
            else Turn(ctx, rendered, req, OutputMachine(stops=req.stop))
        head, echoed = _head(ctx, body, rid), echo_text(ctx, body, prompt) if body.echo else ""
        # streamed completions are not recorded in metrics
        return await answer(ctx, request, turn, lambda i, last, timed: CompletionEncoder(
            *head, include_usage=_include_usage(body), logprobs=want, echoed=echoed,
            index=i, last=last, timed=timed, verbose=ctx.settings.verbose), stream=body.stream,
            timings=body.timings_per_token, metrics=False)

    @get(["/v1/models", "/models"])
    async def models() -> Response:
        """Each model the server holds, with what it serves (``capabilities``): the chat
        model under each of its names (``--alias a,b``), then the side models; in
        OpenAI's ``data`` and in llama-server's ``models`` (its clients read the
        capabilities there)."""
        names = (ctx.settings.aliases() or (ctx.model_name,)) if ctx.has_chat else ()
        tags = ctx.settings.tag_list()  # --tags: the chat model's, as llama-server lists them
        entries = [(name, chat_capabilities(ctx), tags) for name in names] + [
            (side.name, [CAPABILITIES.get(task, task)], []) for task, side in ctx.sides.items()]
        return Response({"object": "list", "data": [
            {"id": name, "object": "model", "created": ctx.created, "owned_by": "user",
             "capabilities": caps, "tags": tags} for name, caps, tags in entries
        ], "models": [
            {"name": name, "model": name, "type": "model", "capabilities": caps, "tags": tags}
            for name, caps, tags in entries]})

    return [chat_completions, completions, models, *embeddings.build(ctx), *audio.build(ctx),
            *images.build(ctx), *unserved_routes(UNSERVED)]
