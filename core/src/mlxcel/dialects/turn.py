"""One chat turn, as every dialect's chat route runs it: its wire request, translated to
the chat layer's ``PromptRequest`` and ``TurnOptions``, becomes a rendered prompt, an
output constraint, a ``GenerationRequest`` and the answer's state machine, submitted.

The rules live in the chat layer (``chat.prompt``, ``chat.structured``, ``chat.request``,
``chat.output``); this module only puts them in their one order, so that Chat Completions,
Responses and Anthropic Messages answer a given turn alike.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request

from mlxcel.chat.answer import Answer, collect
from mlxcel.chat.logit_bias import request_bias
from mlxcel.chat.media import MediaInput, check_media, fetch_media, media_parts
from mlxcel.chat.output import OutputMachine, answer_machine
from mlxcel.chat.prompt import prompt_input
from mlxcel.chat.reasoning import budget_limit, without_thinking
from mlxcel.chat.request import (
    max_tokens,
    request_loop_policy,
    sampling_params,
    server_loop_policy,
    server_sampling_defaults,
)
from mlxcel.chat.structured import compile_constraint, tool_constraint
from mlxcel.context import AppContext
from mlxcel.dialects.choices import Choices, check_choices
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.wire import record_usage, unless_disconnected
from mlxcel.errors import CapabilityNotSupported
from mlxcel.families.media import media_kinds
from mlxcel.media.api import MediaLimits
from mlxcel.media.fetch import FetchPolicy
from mlxcel.types import GenerationRequest, ReasoningLimit
from mlxcel.types.constraints import Constraint
from mlxcel.types.media import MediaPrompt
from mlxcel.types.messages import PromptInput, PromptRequest
from mlxcel.types.requests import LazyStart


class TurnOptions(msgspec.Struct, kw_only=True):
    """A turn's generation fields in the chat layer's names; None (or a key left out of
    ``sampling``/``loop``) takes the server's default.

    ``sampling``: ``SamplingParams`` fields (``chat.request.SAMPLING_DEFAULTS`` keys);
    ``loop``: the three loop-detection fields; ``limit_field``: the wire name of the
    output-token limit, for its error message; ``response``: the answer's constraint from
    the dialect's structured-output field (``chat.structured.response_constraint``);
    ``reasoning_budget``: the request's thinking budget in tokens (None: the server's
    ``--reasoning-budget``; -1: unrestricted); ``lazy``: where a lazy ``response``
    grammar starts (``chat.lazy_grammar``; None: from the first token).
    """

    sampling: dict[str, Any] = {}
    loop: dict[str, int | None] = {}
    limit: int | None = None
    limit_field: str = "max_tokens"
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    cache_prompt: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    response: Constraint | None = None
    lazy: LazyStart | None = None
    reasoning_budget: int | None = None
    logit_bias: Any = None  # the wire value (chat.logit_bias reads it with the tokenizer)
    return_progress: bool = False  # prefill progress events (streamed answers only)
    draft: dict[str, int | None] = {}  # GenerationRequest's draft_max / draft_min


def generation_request(ctx: AppContext, prompt: list[int], request_id: str,
                       options: TurnOptions, *, priority: int = 1, guide: Any = None,
                       guide_after: str | None = None,
                       reasoning_limit: ReasoningLimit | None = None,
                       cache_marks: tuple[tuple[int, str], ...] = (),
                       media: MediaPrompt | None = None) -> GenerationRequest:
    """The engine's request: sampling over the server's defaults (validated), the loop
    policy, and the output limit fitted to the context."""
    check_choices(ctx, options.n)
    ckpt = ctx.checkpoint
    sampling = sampling_params(options.sampling, server_sampling_defaults(ckpt, ctx.settings),
                               logprobs=options.logprobs, top_logprobs=options.top_logprobs)
    sampling = msgspec.structs.replace(sampling, logit_bias=request_bias(
        options.logit_bias, ckpt.tokenizer, options.ignore_eos))
    server_loop = server_loop_policy(ckpt.family.loop_detection, ctx.settings.loop_detection)
    loop = request_loop_policy(options.loop, server_loop)
    wanted = max_tokens(options.limit, options.limit_field, ctx.settings.n_predict)
    return GenerationRequest(request_id=request_id, prompt_tokens=tuple(prompt),
                             max_tokens=ctx.engine.fit(len(prompt), wanted), sampling=sampling,
                             stop=options.stop, ignore_eos=options.ignore_eos,
                             priority=priority, loop=loop, cache_prompt=options.cache_prompt,
                             guide=guide, guide_after=guide_after,
                             guide_lazy=options.lazy if guide is not None else None,
                             reasoning_limit=reasoning_limit, cache_marks=cache_marks,
                             media=media,
                             media_digests=media.digest_positions() if media else (),
                             return_progress=options.return_progress, **options.draft)


class Turn:
    """A submitted turn: its prompt, request, event stream and answer's state machine."""

    def __init__(self, ctx: AppContext, prompt: PromptInput, req: GenerationRequest,
                 machine: OutputMachine) -> None:
        self.started = time.perf_counter()
        self.prompt, self.request, self.machine = prompt, req, machine
        self.stream = ctx.engine.submit(req)

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

    def on_finish(self, ctx: AppContext) -> Any:
        """The callback a streamed answer's end reports to the metrics with."""
        return lambda finish: ctx.metrics.record(finish, self.started)


def budget_of(ctx: AppContext, options: TurnOptions) -> int | None:
    """The turn's reasoning budget: the request's (checked by the dialect, e.g.
    ``chat.request.reasoning_budget``), else ``--reasoning-budget``; None: unrestricted."""
    budget = options.reasoning_budget
    if budget is None:
        budget = ctx.settings.reasoning_budget
    return None if budget < 0 else budget


async def render(ctx: AppContext, request: Request, prompt: PromptRequest) -> PromptInput:
    """The rendered, tokenized prompt (off the event loop for a large body or one with
    media), its media parts fetched first (``gather_media``)."""
    media = await gather_media(ctx, prompt)
    return await prepare_for(request, lambda: prompt_input(
        prompt, ctx.engine, server_kwargs=ctx.settings.chat_template_kwargs,
        reasoning=ctx.checkpoint.reasoning, media=media), heavy=media is not None)


async def gather_media(ctx: AppContext, prompt: PromptRequest) -> MediaInput | None:
    """The prompt's media parts, checked against what the model takes (501 before any
    fetch) and ``--max-images``, then fetched under the fetch policy; None without any."""
    parts = media_parts(prompt.messages)
    if not parts:
        return None
    settings = ctx.settings
    if settings.distributed != "off":  # the other ranks see a row's tokens only
        raise CapabilityNotSupported(f"media input is not supported with --distributed: "
                                     f"{parts[0][0]} is media", param=parts[0][0])
    check_media(parts, media_kinds(ctx.checkpoint.model), settings.max_images)
    fetched = await fetch_media(parts, FetchPolicy.from_settings(settings))
    return MediaInput(fetched, ctx.plugins.media_decoders, MediaLimits.of(settings),
                      dict(prompt.media_options), ctx.decoded)


async def start_turn(ctx: AppContext, request: Request, prompt: PromptRequest,
                     options: TurnOptions, request_id: str, *, priority: int = 1,
                     rendered: PromptInput | None = None) -> Turn | Choices:
    """Render ``prompt`` (unless ``rendered`` already is), constrain a forced tool choice
    or the response's shape (the constraint starts after a reasoning block the prompt
    opened), and submit (``options.n`` > 1: that many choices, ``Choices``). Every
    refusal is raised before the request is queued."""
    ckpt = ctx.checkpoint
    budget = budget_of(ctx, options)
    if rendered is None:
        kwargs = without_thinking(prompt.template_kwargs, budget)
        rendered = await render(ctx, request, msgspec.structs.replace(
            prompt, template_kwargs=kwargs))
    constraint = tool_constraint(ckpt, rendered, options.response)
    guide = None if constraint is None else await compile_constraint(
        ctx.constraint_compiler(), constraint)
    spec = ckpt.reasoning
    after = spec.close if guide is not None and spec is not None and rendered.reasoning_open \
        else None
    limit = budget_limit(spec, budget, ckpt.tokenizer, rendered.reasoning_open)
    req = generation_request(ctx, list(rendered.token_ids), request_id, options,
                             priority=priority, guide=guide, guide_after=after,
                             reasoning_limit=limit, cache_marks=rendered.cache_marks,
                             media=rendered.media)
    if options.n > 1:
        return Choices(ctx, rendered, req, options.n)
    return Turn(ctx, rendered, req, answer_machine(ckpt, req, rendered))
