"""What a tool-call parser gives back: a typed union of events, and the authoritative calls.

A parser is fed the model's answer text (special tokens' text included) and turns it into
these. The events stream what is settled so far; ``ParsedCall``s, from ``finish()``, are
the calls of the whole answer, which a response reports even where the stream went wrong.
"""

from __future__ import annotations

import msgspec


class ToolText(msgspec.Struct, frozen=True, kw_only=True, tag="text"):
    """Answer text outside any call (a format's markup never is)."""

    text: str


class CallStart(msgspec.Struct, frozen=True, kw_only=True, tag="call_start"):
    """Call ``index`` (0, 1, ... in answer order) begins: its function's name, and its id
    when the format writes one (else the server gives it one)."""

    index: int
    name: str
    id: str | None = None


class CallArguments(msgspec.Struct, frozen=True, kw_only=True, tag="call_arguments"):
    """A fragment of call ``index``'s arguments; the fragments of one call concatenate to a
    JSON object's text."""

    index: int
    text: str


class CallEnd(msgspec.Struct, frozen=True, kw_only=True, tag="call_end"):
    index: int


class CallError(msgspec.Struct, frozen=True, kw_only=True, tag="call_error"):
    """Markup that opened a call but does not parse as one: ``text`` is what it held (the
    server logs ``message`` and decides what the client sees). ``index``: the call it
    breaks when that call was already started (``CallStart``), so that the whole answer's
    calls (``ParsedCall``, which leave it out) line up with the streamed ones after it;
    None when no started call broke."""

    message: str
    text: str = ""
    index: int | None = None


ToolEvent = ToolText | CallStart | CallArguments | CallEnd | CallError


class ParsedCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call of the whole answer: ``arguments`` is a JSON object's text."""

    name: str
    arguments: str
    id: str | None = None


class ParseResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``finish()`` returns: the events still held, then every call of the answer."""

    events: tuple[ToolEvent, ...] = ()
    calls: tuple[ParsedCall, ...] = ()
