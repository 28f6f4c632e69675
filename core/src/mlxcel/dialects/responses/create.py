"""``POST /v1/responses``: one turn over the request's history, whole or streamed, after a
compaction when ``context_management`` asks for one and the input has grown to its
threshold (or leaves no room for the answer). A finished response is stored (``store``)
and extends its conversation."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request

from mlxcel.context import AppContext
from mlxcel.dialects.openai.errors import error_type
from mlxcel.dialects.timings import Watch
from mlxcel.dialects.turn import start_turn
from mlxcel.dialects.wire import SSEResponse, client_closed, request_priority, stream_answer
from mlxcel.errors import MlxcelError
from mlxcel.middleware import key_scope

from . import schemas as s
from .bounds import check_metadata
from .compactor import SUMMARY_TOKENS, Compacted, Compactor, keep_tokens
from .history import chat_messages, check_room, conversation_id, history_of, remember
from .params import InputPaths, input_count
from .store import Stores
from .stream import ResponseBuilder, SSEEncoder, frame
from .translate import (
    check_request,
    compact_threshold,
    prompt_request,
    response_of,
    tool_choice_of,
    tools_of,
    turn_options,
)

Item = dict[str, Any]


def template(ctx: AppContext, body: s.CreateRequest, rid: str, storing: bool) -> s.Response:
    """The response's fields that echo the request (``store`` says whether it is kept:
    never with storing off)."""
    cid = conversation_id(body.conversation)
    text = {"format": {"type": "text"}, **(body.text or {})}
    return s.Response(
        id=rid, created_at=int(time.time()), model=body.model or ctx.model_name,
        status="in_progress", instructions=body.instructions, metadata=body.metadata or {},
        tools=body.tools or [], tool_choice=body.tool_choice or "auto",
        parallel_tool_calls=body.parallel_tool_calls is not False,
        temperature=body.temperature, top_p=body.top_p,
        max_output_tokens=body.max_output_tokens,
        previous_response_id=body.previous_response_id,
        conversation={"id": cid} if cid else None, text=text,
        reasoning=body.reasoning or {"effort": None, "summary": None},
        store=body.store and storing)


class Create:
    """One create request, checked and translated before anything is generated."""

    def __init__(self, ctx: AppContext, request: Request, stores: Stores,
                 body: s.CreateRequest) -> None:
        check_request(body)
        check_metadata(body.metadata)
        self.ctx, self.request, self.stores, self.body = ctx, request, stores, body
        self.scope = key_scope(request.scope)
        self.threshold = compact_threshold(body.context_management)
        self.history = history_of(stores, self.scope, body)
        check_room(stores, self.scope, body, self.history)
        self.tools, self.choice = tools_of(body.tools), tool_choice_of(body.tool_choice)
        self.options = turn_options(body, response_of(body.text))
        self.rid = f"resp_{uuid.uuid4().hex}"
        tok = ctx.checkpoint.tokenizer
        self.builder = ResponseBuilder(template(ctx, body, self.rid, stores.responses.enabled),
                                       lambda text: len(tok.encode(text)))
        self.compactor = Compactor(ctx, request, self.prompt, self.options)
        self.keep = keep_tokens(ctx, None)
        # the summary's limit: 1024, at most a quarter of the context, so that a summary
        # of the history that filled a small context still fits beside its prompt
        self.summary_limit = max(1, min(SUMMARY_TOKENS, ctx.engine.context_size // 4))

    def prompt(self, messages: list[Any]) -> Any:
        return prompt_request(self.body, self.body.instructions, messages, tools=self.tools,
                              tool_choice=self.choice)

    def done(self, response: s.Response) -> None:
        remember(self.stores, self.scope, self.body, response, self.history)

    def paths(self) -> InputPaths:
        return InputPaths(self.body, self.history, input_count(self.body.input),
                          1 if self.body.instructions else 0)

    async def _turn(self) -> Any:
        try:
            return await start_turn(self.ctx, self.request,
                                    self.prompt(chat_messages(self.history)), self.options,
                                    self.rid, priority=request_priority(self.request))
        except MlxcelError as exc:
            raise self.paths().rename(exc) from None

    async def _compaction_due(self) -> int | None:
        """The input's size when it is due for compaction (None: not due). A history
        with nothing older than the turns compaction keeps goes on as it is."""
        if self.threshold is None:
            return None
        try:
            before = await self.compactor.size(self.history)
        except MlxcelError as exc:
            raise self.paths().rename(exc) from None
        room = self.ctx.engine.context_size - before
        if before < self.threshold and room >= (self.body.max_output_tokens or 1):
            return None
        return before if self.compactor.plan(self.history, self.keep).dropped else None

    def _compacted(self, result: Compacted) -> list[dict[str, Any]]:
        """Generation goes on from the compacted history; the output starts with the
        compaction item."""
        self.history = result.output
        item = result.output[-1]
        return self.builder.add_item(s.CompactionItem(
            id=item["id"], encrypted_content=item["encrypted_content"]))

    async def answer(self) -> Any:
        due = await self._compaction_due()
        if due is not None and self.body.stream:
            return SSEResponse(self._compacting_stream(due))
        if due is not None:
            result = await self.compactor.run(self.history, self.keep,
                                              self.summary_limit, before=due)
            if result is None:
                return client_closed()
            self._compacted(result)
        turn = await self._turn()
        if self.body.stream:
            encoder = SSEEncoder(self.builder, on_done=self.done, timed=self._timed(turn),
                                 progress=turn.request.return_progress)
            return SSEResponse(stream_answer(self.request, turn.stream, turn.machine, encoder,
                                             on_finish=turn.on_finish(self.ctx)))
        watch, prompt_n, _ = self._timed(turn)
        answer = await turn.whole(self.ctx, self.request)
        if answer is None:
            return client_closed()
        response = self.builder.whole(answer)
        if answer.finish.usage.draft_rounds:  # the spec's speculative timings
            response.timings = watch.timings(answer.finish.usage)
        self.done(response)
        return response

    def _timed(self, turn: Any) -> tuple[Watch, int, bool]:
        """The turn's stream watched for ``timings``: its ``Watch``, the prompt's length,
        and whether every batch of events carries them (``timings_per_token``)."""
        turn.stream = Watch(turn.stream)
        return turn.stream, len(turn.request.prompt_tokens), self.body.timings_per_token

    def _failed(self, exc: MlxcelError) -> bytes:
        error = {"code": exc.code or error_type(exc), "message": exc.message}
        return frame(self.builder.event("response.failed",
                                        response=self.builder.snapshot("failed", error=error)))

    async def _compacting_stream(self, before: int) -> AsyncIterator[bytes]:
        """The stream of a turn that compacts first: the compaction's own events after
        ``response.in_progress``; a refusal after the stream opened is ``response.failed``."""
        builder = self.builder
        yield b"".join(frame(e) for e in builder.start())
        yield frame(builder.event("mlx.compaction.started", input_tokens=before))
        try:
            result = await self.compactor.run(self.history, self.keep,
                                              self.summary_limit, before=before,
                                              watch_client=False)
        except MlxcelError as exc:
            yield self._failed(exc)
            return
        assert result is not None
        yield b"".join(frame(e) for e in [
            builder.event("mlx.compaction.completed", input_tokens_before=before,
                          input_tokens_after=result.after), *self._compacted(result)])
        try:
            turn = await self._turn()
        except MlxcelError as exc:
            yield self._failed(exc)
            return
        encoder = SSEEncoder(builder, started=True, on_done=self.done,
                             timed=self._timed(turn))
        async for chunk in stream_answer(self.request, turn.stream, turn.machine, encoder,
                                         on_finish=turn.on_finish(self.ctx)):
            yield chunk
