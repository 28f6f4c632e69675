"""An answer's typed deltas -> Responses output items and their SSE events.

One builder makes both the streamed events and the final response object, so that a
streamed answer and a whole one have the same items. The rules:

- Items come in the order their deltas do: a ``reasoning`` item (``reasoning_text``
  content), a ``message`` item (one ``output_text`` part) and one ``function_call`` item
  per tool call. An item opens at the first delta of its kind with more than whitespace;
  whitespace before it is held and goes into it (or nowhere, when another kind opens).
- An answer that opened no item gets an empty message, so ``output`` is never empty.
- The item open when generation stopped by length is ``incomplete``, and so is the
  response (``incomplete_details.reason: "max_output_tokens"``).
- Every event carries ``sequence_number``, from 0 (``response.created``) up by one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from mlxcel import types as mt
from mlxcel.chat.answer import Answer, failure
from mlxcel.dialects.timings import Watch, progress_object

from . import schemas as s

Event = dict[str, Any]
_encoder = msgspec.json.Encoder()
PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


def frame(event: Event) -> bytes:
    """One SSE frame with its ``event:`` line."""
    return b"event: " + event["type"].encode() + b"\ndata: " + _encoder.encode(event) + b"\n\n"


def wire_usage(u: mt.Usage, reasoning_tokens: int = 0) -> s.Usage:
    """Usage in the Responses shape; ``reasoning_tokens`` are the reasoning text's tokens
    (re-encoded: the engine counts the answer's tokens, not where each one went)."""
    return s.Usage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
                   total_tokens=u.total_tokens,
                   input_tokens_details={"cached_tokens": u.cached_tokens},
                   output_tokens_details={"reasoning_tokens": min(reasoning_tokens,
                                                                  u.completion_tokens)})


def item_id(kind: str) -> str:
    return f"{PREFIX[kind]}_{uuid.uuid4().hex}"


class _Open:
    """The item being streamed."""

    def __init__(self, kind: str, index: int, call: mt.ToolCallStart | None = None) -> None:
        self.kind, self.index, self.call = kind, index, call
        self.id, self.text = item_id(kind), ""

    def item(self, status: str) -> s.OutputItem:
        if self.kind == "message":
            return s.MessageItem(id=self.id, status=status,
                                 content=[s.OutputText(text=self.text)] if status !=
                                 "in_progress" else [])
        if self.kind == "reasoning":
            return s.ReasoningItem(id=self.id, status=status,
                                   content=[s.ReasoningText(text=self.text)] if status !=
                                   "in_progress" else [])
        assert self.call is not None
        return s.FunctionCallItem(id=self.id, status=status, call_id=self.call.id,
                                  name=self.call.name, arguments=self.text)

    def part(self) -> Any:
        return s.OutputText(text=self.text) if self.kind == "message" \
            else s.ReasoningText(text=self.text)


class ResponseBuilder:
    """One response's output items and events; ``template`` holds the echoed request
    fields, ``reasoning_tokens`` counts a reasoning text's tokens for the usage."""

    def __init__(self, template: s.Response, reasoning_tokens: Callable[[str], int]) -> None:
        self.template, self.reasoning_tokens = template, reasoning_tokens
        self.output: list[s.OutputItem] = []
        self.seq = 0
        self._open: _Open | None = None
        self._held = ("", "")  # (kind, whitespace) not yet in any item
        self._answer_items = 0  # items this answer opened
        self._reasoning = ""
        self.final: s.Response | None = None

    def event(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def snapshot(self, status: str, **fields: Any) -> s.Response:
        return msgspec.structs.replace(self.template, status=status, output=list(self.output),
                                       **fields)

    def start(self) -> list[Event]:
        return [self.event("response.created", response=self.snapshot("in_progress")),
                self.event("response.in_progress", response=self.snapshot("in_progress"))]

    def add_item(self, item: s.OutputItem) -> list[Event]:
        """A finished item (a compaction item), added and done at once."""
        index = len(self.output)
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=index, item=item),
                self.event("response.output_item.done", output_index=index, item=item)]

    # -- deltas --------------------------------------------------------------------------
    def feed(self, delta: mt.Delta) -> list[Event]:
        if isinstance(delta, mt.ContentDelta):
            return self._text("message", delta.text)
        if isinstance(delta, mt.ReasoningDelta):
            self._reasoning += delta.text
            return self._text("reasoning", delta.text)
        if isinstance(delta, mt.ToolCallStart):
            self._held = ("", "")
            return [*self._close("completed"), *self._begin("function_call", delta)]
        if isinstance(delta, mt.ToolCallArguments):
            is_open = self._open is not None and self._open.kind == "function_call"
            return self._append(delta.text) if is_open else []
        if isinstance(delta, mt.ToolCallEnd):
            return self._close("completed")
        return self.finish(delta)

    def _text(self, kind: str, text: str) -> list[Event]:
        if self._open is not None and self._open.kind == kind:
            return self._append(text)
        held_kind, held = self._held
        text = (held if held_kind == kind else "") + text
        if not text.strip():
            self._held = (kind, text)
            return []
        self._held = ("", "")
        return [*self._close("completed"), *self._begin(kind), *self._append(text)]

    def _begin(self, kind: str, call: mt.ToolCallStart | None = None) -> list[Event]:
        self._open = opened = _Open(kind, len(self.output), call)
        self._answer_items += 1
        self.output.append(opened.item("in_progress"))
        where = {"output_index": opened.index}
        out = [self.event("response.output_item.added", **where,
                          item=opened.item("in_progress"))]
        if kind != "function_call":
            out.append(self.event("response.content_part.added", item_id=opened.id, **where,
                                  content_index=0, part=opened.part()))
        return out

    def _append(self, text: str) -> list[Event]:
        opened = self._open
        assert opened is not None
        opened.text += text
        where = {"item_id": opened.id, "output_index": opened.index}
        if opened.kind == "message":
            return [self.event("response.output_text.delta", **where, content_index=0,
                               delta=text, logprobs=[])]
        if opened.kind == "reasoning":
            return [self.event("response.reasoning_text.delta", **where, content_index=0,
                               delta=text)]
        return [self.event("response.function_call_arguments.delta", **where, delta=text)]

    def _close(self, status: str) -> list[Event]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        item = opened.item(status)
        self.output[opened.index] = item
        where = {"item_id": opened.id, "output_index": opened.index}
        if opened.kind == "function_call":
            out = [self.event("response.function_call_arguments.done", **where,
                              arguments=opened.text)]
        else:
            done = "response.output_text.done" if opened.kind == "message" \
                else "response.reasoning_text.done"
            extra = {"logprobs": []} if opened.kind == "message" else {}
            out = [self.event(done, **where, content_index=0, text=opened.text, **extra),
                   self.event("response.content_part.done", **where, content_index=0,
                              part=opened.part())]
        out.append(self.event("response.output_item.done", output_index=opened.index,
                              item=item))
        return out

    # -- the end -------------------------------------------------------------------------
    def finish(self, finish: mt.Finish) -> list[Event]:
        if not finish.ok:
            error = {"code": "server_error", "message": failure(finish)}
            return [self.event("response.failed", response=self.snapshot("failed",
                                                                         error=error))]
        status = "incomplete" if finish.reason == "length" else "completed"
        out = self._close(status)
        if not self._answer_items:
            held_kind, held = self._held
            out += self._begin("message") + self._append(held if held_kind == "message"
                                                         else "")
            out += self._close(status)
        self.final = self.snapshot(status, usage=self._usage(finish), **(
            {"incomplete_details": {"reason": "max_output_tokens"}} if status == "incomplete"
            else {"completed_at": int(time.time())}))
        return out + [self.event(f"response.{status}", response=self.final)]

    def _usage(self, finish: mt.Finish) -> s.Usage:
        assert finish.usage is not None
        reasoning = self.reasoning_tokens(self._reasoning) if self._reasoning else 0
        return wire_usage(finish.usage, reasoning)

    def whole(self, answer: Answer) -> s.Response:
        """The response of a whole answer (its deltas in the order reasoning, content,
        calls)."""
        assert answer.finish is not None
        deltas: list[mt.Delta] = [mt.ReasoningDelta(text=answer.reasoning),
                                  mt.ContentDelta(text=answer.content)]
        for i, call in enumerate(answer.calls):
            deltas += [mt.ToolCallStart(index=i, id=call.id, name=call.name),
                       mt.ToolCallArguments(index=i, text=call.arguments),
                       mt.ToolCallEnd(index=i)]
        for delta in [*deltas, answer.finish]:
            self.feed(delta)
        assert self.final is not None
        return self.final


class SSEEncoder:
    """The builder's events as SSE frames for ``wire.stream_answer``; ``on_done`` gets the
    final response of an answer that ended well.

    llama-server's extensions, when the request asks: ``return_progress``
    (``progress``) puts ``prompt_progress`` on a ``response.in_progress`` event per
    prefill chunk, the first report on the one that opens the stream after
    ``response.created`` (llama-server opens a Responses stream at its first report);
    ``timings_per_token`` (``timed``: the answer's ``Watch``, prompt length and that flag)
    adds ``timings`` to the last event of each batch of deltas, the final one included;
    without it only the final batch carries them, when a drafter ran a verify round."""

    def __init__(self, builder: ResponseBuilder, *, started: bool = False,
                 on_done: Callable[[s.Response], None] | None = None,
                 timed: tuple[Watch, int, bool] | None = None,
                 progress: bool = False) -> None:
        self.builder, self.started, self.on_done = builder, started, on_done
        self.timed = timed
        self.opens_late = progress and not started  # the first report opens the stream

    def first(self) -> bytes | None:
        if self.started or self.opens_late:
            return None
        self.started = True
        return b"".join(frame(e) for e in self.builder.start())

    def _opening(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``, once, if still unsent."""
        if self.started:
            return []
        self.started = True
        return self.builder.start()

    def progress(self, p: mt.PromptProgress) -> list[bytes]:
        events = self._opening() or [self.builder.event(
            "response.in_progress", response=self.builder.snapshot("in_progress"))]
        events[-1] = {**events[-1], "prompt_progress": progress_object(p)}
        return [frame(e) for e in events]

    def encode(self, deltas: list[mt.Delta]) -> list[bytes]:
        events = self._opening() + [e for d in deltas for e in self.builder.feed(d)]
        if events and self.timed is not None:
            watch, prompt_n, per_token = self.timed
            end = deltas[-1].usage if isinstance(deltas[-1], mt.Finish) else None
            if per_token or (end is not None and end.draft_rounds):
                events[-1] = {**events[-1],
                              "timings": watch.timings(end or watch.running(prompt_n))}
        out = [frame(e) for e in events]
        if self.builder.final is not None and self.on_done is not None:
            self.on_done(self.builder.final)
            self.on_done = None
        return out
