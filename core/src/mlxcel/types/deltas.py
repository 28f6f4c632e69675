"""What the chat layer's output state machine gives a dialect: typed deltas of one answer.

A dialect's stream encoder turns these into its own frames; nothing in them is wire-shaped.
Adjacent deltas of one kind may be merged by a consumer without changing the meaning
(``chat.output.merge`` does it), which is what makes the result independent of how the
model's text was split into tokens.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from mlxcel.types.events import TokenLogprob, Usage
from mlxcel.types.toolcalls import ParsedCall


class ContentDelta(msgspec.Struct, frozen=True, kw_only=True, tag="content"):
    """Answer text for the user (free of special-token markers); ``logprobs`` are those of
    the tokens generated since the previous delta, also when no text is ready yet."""

    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()


class ReasoningDelta(msgspec.Struct, frozen=True, kw_only=True, tag="reasoning"):
    """Text inside the model's reasoning block (markers removed)."""

    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()


class ToolCallStart(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call_start"):
    """A tool call begins: its position in the answer, its id and the function's name."""

    index: int
    id: str
    name: str


class ToolCallArguments(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call_arguments"):
    """A fragment of the call's JSON arguments; the fragments of one call concatenate."""

    index: int
    text: str


class ToolCallEnd(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call_end"):
    index: int


AnswerFinish = Literal["stop", "length", "tool_calls", "error", "cancelled"]


class Finish(msgspec.Struct, frozen=True, kw_only=True, tag="finish"):
    """The last delta: why the answer ended, its usage, the engine's message when it
    failed (``error``) or was cancelled, and the answer's tool calls as parsed from the
    whole answer (authoritative; with the ids their streamed deltas had).
    ``reasoning_only``: the answer produced reasoning and nothing else (no content beyond
    whitespace, no call), as when a thinking block used up ``max_tokens``.
    ``stop_sequence``: the request's stop string that ended the answer, when one did."""

    reason: AnswerFinish
    usage: Usage | None = None
    error: str | None = None
    calls: tuple[ParsedCall, ...] = ()
    reasoning_only: bool = False
    stop_sequence: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason not in ("error", "cancelled")


Delta = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArguments | ToolCallEnd | Finish
