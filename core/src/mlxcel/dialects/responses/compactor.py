"""Running a compaction (``compaction`` holds its rules): count the history, plan the
split, generate the summary once (not streamed, bounded by its own output limit), and
refuse with 400 ``context_length_exceeded``, changing nothing, when the summary cannot fit
even of nothing, the kept turns alone do not fit, or the result would not be shorter.

A history longer than the context (a conversation whose answer filled it) is compacted
too: the summary reads the dropped items within one context, the oldest turns left out
first (``fitting``), and an item too long on its own keeps its newest text."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Request

from mlxcel.chat.answer import Answer, collect
from mlxcel.chat.reasoning import without_thinking
from mlxcel.context import AppContext
from mlxcel.dialects.turn import TurnOptions, budget_of, render, start_turn
from mlxcel.errors import ContextLengthExceeded, InvalidRequest
from mlxcel.types import Usage
from mlxcel.types.messages import Message, PromptRequest

from .compaction import (
    Plan,
    compacted,
    item_text,
    plan,
    replay,
    split_points,
    summary_request_items,
)
from .history import chat_messages
from .items import messages

Item = dict[str, Any]
Prompt = Callable[[list[Message]], PromptRequest]
KEEP_TOKENS_MAX = 8192
SUMMARY_TOKENS, SUMMARY_TOKENS_MAX = 1024, 16384


def keep_tokens(ctx: AppContext, value: int | None) -> int:
    """``keep_tokens``: > 0; by default 1/16 of the context window, at most 8192."""
    if value is None:
        return max(1, min(ctx.engine.context_size // 16, KEEP_TOKENS_MAX))
    if isinstance(value, bool) or value <= 0:
        raise InvalidRequest("'keep_tokens' must be a positive integer", param="keep_tokens")
    return value


def summary_tokens(value: int | None) -> int:
    """The summary's output limit: 1..16384, 1024 by default."""
    if value is None:
        return SUMMARY_TOKENS
    if isinstance(value, bool) or not 1 <= value <= SUMMARY_TOKENS_MAX:
        raise InvalidRequest(f"'max_output_tokens' must be from 1 to {SUMMARY_TOKENS_MAX} "
                             "for a compaction", param="max_output_tokens")
    return value


class Compacted(msgspec.Struct, kw_only=True):
    output: list[Item]  # the compacted history: instructions, kept items, compaction item
    usage: Usage  # the summary generation's
    before: int  # rendered input tokens before and after
    after: int


class Compactor:
    """One request's compaction: ``prompt`` makes the request's prompt from messages
    (its instructions, tools and template variables), for counting and for the summary."""

    def __init__(self, ctx: AppContext, request: Request, prompt: Prompt,
                 options: TurnOptions) -> None:
        self.ctx, self.request, self.prompt, self.options = ctx, request, prompt, options

    async def count(self, items: list[Item]) -> int:
        """Rendered prompt tokens of a history, as ``/v1/responses/input_tokens`` counts."""
        prompt = self.prompt(chat_messages(items))
        kwargs = without_thinking(prompt.template_kwargs, budget_of(self.ctx, self.options))
        prompt = msgspec.structs.replace(prompt, template_kwargs=kwargs)
        return len((await render(self.ctx, self.request, prompt)).token_ids)

    def plan(self, items: list[Item], keep: int) -> Plan:
        """The split of ``items`` (replayed), items counted by their text's tokens."""
        tok = self.ctx.checkpoint.tokenizer
        return plan(replay(items), keep, lambda item: len(tok.encode(item_text(item))))

    async def run(self, items: list[Item], keep: int, limit: int, *,
                  before: int | None = None, watch_client: bool = True) -> Compacted | None:
        """The compacted history (None: the client left during the summary)."""
        if before is None:
            before = await self.size(items)
        split = self.plan(items, keep)
        if not split.dropped:
            raise ContextLengthExceeded("nothing older than the kept turns to compact, so the "
                                        "result would not be shorter", param="input")
        split = await self.fitting(split, limit)
        answer = await self._summary(summary_request_items(split), limit, watch_client)
        if answer is None:
            return None
        assert answer.finish is not None and answer.finish.usage is not None
        output = compacted(split, (answer.content.strip() or answer.reasoning.strip()))
        try:
            after = await self.count(output)
        except ContextLengthExceeded:
            raise ContextLengthExceeded("the kept turns alone do not fit the context window; "
                                        "lower 'keep_tokens'", param="input") from None
        if after >= before:
            raise ContextLengthExceeded(f"compaction would not make the input shorter ({before} "
                                        f"tokens before, {after} after)", param="input")
        return Compacted(output=output, usage=answer.finish.usage, before=before, after=after)

    async def size(self, items: list[Item]) -> int:
        """The history's rendered tokens, or the context size when it is longer."""
        try:
            return await self.count(items)
        except ContextLengthExceeded:
            return self.ctx.engine.context_size

    async def _room(self, split: Plan, dropped: list[Item]) -> int:
        """Tokens the context leaves beside the summary prompt over ``dropped`` (< 0: the
        prompt alone is over the context)."""
        prompt = self._summary_prompt(summary_request_items(
            msgspec.structs.replace(split, dropped=dropped)))
        try:
            rendered = await render(self.ctx, self.request, prompt)
        except ContextLengthExceeded:
            return -1
        return self.ctx.engine.context_size - len(rendered.token_ids)

    async def fitting(self, split: Plan, limit: int) -> Plan:
        """``split`` with the dropped items the summary can read within the context beside
        ``limit`` tokens: the oldest turns left out first (a binary search over the turn
        starts), then the newest item alone, its text cut to its end when even that is
        too long. Unchanged when everything fits."""
        dropped = split.dropped
        if await self._room(split, dropped) >= limit:
            return split
        starts = [p for p in split_points(dropped) if 0 < p < len(dropped)]
        starts.append(len(dropped) - 1)
        lo, hi = 0, len(starts)  # the first start whose suffix fits, or hi: none does
        while lo < hi:
            mid = (lo + hi) // 2
            if await self._room(split, dropped[starts[mid]:]) >= limit:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(starts):
            return msgspec.structs.replace(split, dropped=dropped[starts[lo]:])
        base = await self._room(split, [])
        cut = self._tail(dropped[-1], base - limit - 16)
        return msgspec.structs.replace(split, dropped=[cut] if cut else [])

    def _tail(self, item: Item, tokens: int) -> Item | None:
        """A message or tool output as its newest ``tokens`` tokens of text (None: none)."""
        if tokens <= 0 or item["type"] not in ("message", "function_call_output"):
            return None
        tok = self.ctx.checkpoint.tokenizer
        text = tok.decode(tok.encode(item_text(item))[-tokens:])
        if item["type"] == "function_call_output":
            return {**item, "output": text}
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        return {"type": "message", "role": item["role"],
                "content": [{"type": kind, "text": text}]}

    def _summary_prompt(self, items: list[Item]) -> PromptRequest:
        prompt = self.prompt(messages(items))
        return msgspec.structs.replace(prompt, tools=(), tool_choice="auto",
                                       template_kwargs=without_thinking(
                                           prompt.template_kwargs, 0))

    async def _summary(self, items: list[Item], limit: int, watch_client: bool
                       ) -> Answer | None:
        """One generation of the summary, without reasoning, within ``limit`` tokens."""
        prompt = self._summary_prompt(items)
        rendered = await render(self.ctx, self.request, prompt)
        room = self.ctx.engine.context_size - len(rendered.token_ids)
        if room < limit:
            raise ContextLengthExceeded(
                f"the summary does not fit: its prompt has {len(rendered.token_ids)} tokens "
                f"and the context window of {self.ctx.engine.context_size} leaves {max(room, 0)}"
                f" for a summary of up to {limit}", param="max_output_tokens")
        options = msgspec.structs.replace(self.options, limit=limit, reasoning_budget=0,
                                          response=None, limit_field="max_output_tokens")
        turn = await start_turn(self.ctx, self.request, prompt, options,
                                f"cmp_{uuid.uuid4().hex[:24]}", rendered=rendered)
        if watch_client:
            return await turn.whole(self.ctx, self.request)
        try:  # inside a streamed response, whose own watch sees the client leave
            answer = await collect(turn.stream, turn.machine)
        finally:
            turn.stream.cancel()
        assert answer.finish is not None
        self.ctx.metrics.record(answer.finish, turn.started)
        return answer
