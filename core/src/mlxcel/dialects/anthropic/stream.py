"""The Messages stream: ``message_start``, each block's ``content_block_start`` /
``content_block_delta`` / ``content_block_stop`` in order, ``message_delta`` (stop reason,
usage), ``message_stop``; a failed answer ends with an ``error`` event in the error
body's shape. Every frame is ``event: NAME`` then ``data: JSON`` (the SDK skips frames
without an event name). The non-streaming body comes from the same encoder, fed the same
deltas (``Tap``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from mlxcel.chat.answer import failure
from mlxcel.errors import GenerationFailed
from mlxcel.types import Delta, Finish, GenerationEvent
from mlxcel.types import Usage as EngineUsage

from . import schemas as s
from .blocks import Blocks, Event
from .errors import error_body

_encode = msgspec.json.Encoder().encode
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def frame(name: str, payload: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


def stop_reason(finish: Finish) -> str:
    """``end_turn``, ``stop_sequence`` (a stop string matched), ``max_tokens`` or
    ``tool_use``."""
    if finish.reason == "stop":
        return "stop_sequence" if finish.stop_sequence is not None else "end_turn"
    return STOP_REASONS[finish.reason]


def wire_usage(usage: EngineUsage | None) -> s.Usage:
    assert usage is not None
    return s.Usage(usage.prompt_tokens - usage.cached_tokens, usage.completion_tokens,
                   cache_read_input_tokens=usage.cached_tokens)


class MessageEncoder:
    """One answer's frames. ``input_tokens``: the rendered prompt's length, what
    ``message_start`` reports before the cache's share is known (``message_delta`` then
    carries the split). ``on_done``: called with the blocks of an answer that ended
    well (the thinking memory)."""

    def __init__(self, rid: str, model: str, input_tokens: int,
                 on_done: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.rid, self.model, self.input_tokens = rid, model, input_tokens
        self.on_done = on_done
        self.blocks = Blocks()
        self.finish: Finish | None = None

    def first(self) -> bytes:
        message = {"id": self.rid, "type": "message", "role": "assistant",
                   "model": self.model, "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        return frame("message_start", {"type": "message_start", "message": message})

    def add(self, delta: Delta) -> list[Event]:
        """The events of one delta; a ``Finish`` adds the closing ones (or the error)."""
        events = self.blocks.add(delta)
        if not isinstance(delta, Finish):
            return events
        if not delta.ok:
            return [*events, error_body(GenerationFailed(failure(delta)))]
        self.finish = delta
        if self.on_done is not None:
            self.on_done(self.blocks.blocks)
        return [*events, {"type": "message_delta",
                          "delta": {"stop_reason": stop_reason(delta),
                                    "stop_sequence": delta.stop_sequence},
                          "usage": msgspec.to_builtins(wire_usage(delta.usage))},
                {"type": "message_stop"}]

    def encode(self, deltas: list[Delta]) -> list[bytes]:
        return [frame(e["type"], e) for d in deltas for e in self.add(d)]

    def whole(self) -> s.MessageResponse:
        """The non-streaming body of the answer the encoder was fed."""
        finish = self.finish
        assert finish is not None
        return s.MessageResponse(self.rid, self.model, self.blocks.blocks, stop_reason(finish),
                                 finish.stop_sequence, wire_usage(finish.usage))


class Tap:
    """An answer's state machine whose deltas also go to ``sink``: a non-streaming turn
    collects through it, so its body is built from the deltas in their order."""

    def __init__(self, machine: Any, sink: Callable[[Delta], Any]) -> None:
        self.machine, self.sink = machine, sink

    def feed(self, event: GenerationEvent) -> list[Delta]:
        deltas = self.machine.feed(event)
        for delta in deltas:
            self.sink(delta)
        return deltas

    def __getattr__(self, name: str) -> Any:
        return getattr(self.machine, name)
