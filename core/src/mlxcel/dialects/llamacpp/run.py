"""Submitting native completions and answering them: one object per prompt (a list when
the request had several), or one SSE stream. Native completions are not counted in the
request metrics (the spec's counting rule); their usage goes to the access log.

With ``n_cmpl`` (or ``n``) > 1 each prompt is answered that many times, its choices
submitted together so that its prompt is prefilled once (``dialects.choices``); result
``index`` p x n_cmpl + c is prompt p's choice c, and a streamed request interleaves its
choices' chunks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import msgspec
from litestar import Request

from mlxcel.chat.answer import collect
from mlxcel.chat.lazy_grammar import lazy_start_of
from mlxcel.chat.output import OutputMachine
from mlxcel.chat.structured import compile_constraint, request_constraint
from mlxcel.context import AppContext
from mlxcel.dialects.choices import choice_requests, merged
from mlxcel.dialects.wire import (
    SSEResponse,
    client_closed,
    record_usage,
    request_priority,
    stream_answer,
    unless_disconnected,
)
from mlxcel.types import Finish, Usage
from mlxcel.types.media import MediaPrompt

from .completion import Plan, choices_of, generation_settings, native_plan
from .schemas import NativeFields
from .stream import NativeEncoder, Watch


class _Run:
    """One submitted prompt: its watched event stream, state machine and encoder."""

    def __init__(self, ctx: AppContext, body: NativeFields, plan: Plan, index: int,
                 truncated: bool, stream: Any) -> None:
        self.watch = Watch(stream)
        self.machine = OutputMachine(stops=plan.request.stop)
        self.encoder = NativeEncoder(
            plan, self.watch, ctx.checkpoint.tokenizer, index=index,
            settings=generation_settings(ctx, plan, body.stream, body),
            context_size=ctx.engine.context_size, return_tokens=body.return_tokens,
            timings_per_token=body.timings_per_token, truncated=truncated)

    async def whole(self) -> tuple[dict[str, Any], Usage | None]:
        answer = await collect(self.watch, self.machine)
        assert answer.finish is not None
        body = self.encoder.final(answer.finish, answer.content, answer.logprobs)
        return body, answer.finish.usage


def _submit(ctx: AppContext, request: Request, body: NativeFields,
            prompts: list[list[int]], truncated: bool,
            media: list[MediaPrompt | None] | None, guide: Any = None,
            lazy: Any = None) -> list[_Run]:
    """Every prompt's plan first (a 400 submits nothing), then each submitted; a refusal
    (503) cancels the ones already admitted. ``guide``: the compiled output constraint
    every prompt's answer obeys (``lazy``: from its trigger on)."""
    priority = request_priority(request)
    images = media if media is not None else [None] * len(prompts)
    plans = [native_plan(ctx, body, ids, f"cmpl-{uuid.uuid4().hex[:24]}", priority, found)
             for ids, found in zip(prompts, images, strict=True)]
    if guide is not None:
        plans = [replace(p, request=msgspec.structs.replace(p.request, guide=guide,
                                                            guide_lazy=lazy))
                 for p in plans]
    n = choices_of(ctx, body)
    runs: list[_Run] = []
    try:
        for i, plan in enumerate(plans):
            reqs = choice_requests(plan.request, n)
            for c, (req, stream) in enumerate(zip(reqs, ctx.engine.submit_choices(reqs),
                                                  strict=True)):
                runs.append(_Run(ctx, body, replace(plan, request=req), i * n + c,
                                 truncated, stream))
    except BaseException:
        for run in runs:
            run.watch.cancel()
        raise
    return runs


async def _gather(runs: list[_Run]) -> list[tuple[dict[str, Any], Usage | None]]:
    """Every answer; one failure cancels the rest and raises."""
    try:
        return await asyncio.gather(*(run.whole() for run in runs))
    except BaseException:
        for run in runs:
            run.watch.cancel()
        raise


async def _stream_runs(runs: list[_Run]) -> AsyncIterator[bytes]:
    """One prompt's choices streamed together: each chunk as its choice makes it; a failed
    choice ends the stream with its error frame (the others are cancelled)."""
    try:
        async for i, event in merged([run.watch for run in runs]):
            run = runs[i]
            if event.progress is not None:
                yield b"".join(run.encoder.progress(event.progress))
                continue
            deltas = run.machine.feed(event)
            out = run.encoder.encode(deltas)
            if out:
                yield b"".join(out)
            if deltas and isinstance(deltas[-1], Finish) and not deltas[-1].ok:
                return
    finally:
        for run in runs:
            run.watch.cancel()


def _record(request: Request, usages: list[Usage | None]) -> None:
    total = [u for u in usages if u is not None]
    record_usage(request, Finish(reason="stop", usage=Usage(
        prompt_tokens=sum(u.prompt_tokens for u in total),
        completion_tokens=sum(u.completion_tokens for u in total))))


async def respond(ctx: AppContext, request: Request, body: NativeFields,
                  prompts: list[list[int]], truncated: bool = False,
                  media: list[MediaPrompt | None] | None = None) -> Any:
    """The response to a native completion of ``prompts`` (token ids, already checked;
    ``media``: each prompt's images, expanded, or None). ``grammar`` or ``json_schema``
    is compiled first (``chat.structured``; its errors are 400s before anything runs)."""
    constraint = request_constraint(grammar=body.grammar, json_schema=body.json_schema)
    lazy = lazy_start_of(body, ctx.checkpoint.tokenizer, constraint)
    guide = None if constraint is None else await compile_constraint(
        ctx.constraint_compiler(), constraint)
    runs = _submit(ctx, request, body, prompts, truncated, media, guide, lazy)
    if body.stream and len(runs) > 1:
        return SSEResponse(_stream_runs(runs))
    if body.stream:
        run = runs[0]
        return SSEResponse(stream_answer(request, run.watch, run.machine, run.encoder))
    results = await unless_disconnected(request, _gather(runs),
                                        lambda: [run.watch.cancel() for run in runs])
    if results is None:
        return client_closed()
    _record(request, [usage for _, usage in results])
    bodies = [b for b, _ in results]
    return bodies[0] if len(bodies) == 1 else bodies
