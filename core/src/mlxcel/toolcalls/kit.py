"""The tool-format kit: what a tool-call parser builds on, in core or in a plugin.

A parser (``mlxcel.toolcalls.api.ToolCallParser``) is fed an answer in the pieces the
model produced, and a piece may end in the middle of a marker. The kit holds the parts
every format needs, so a format module only says what its markup means:

- ``partial_suffix(buf, markers)``: how much of ``buf``'s end might begin a marker, to
  hold back until the next piece settles it; ``first_of(text, markers)``: where the
  first marker stands.
- ``TextStates``: a parser whose states are methods ``_<state>(events)`` over the held
  text ``buf``; ``feed`` runs them until one waits. ``text_until(events, openers)`` sends
  the answer text before a call's opener (holding a partial one), and ``send(events,
  Decoded(...))`` sends a whole call (start, arguments, end) and records it in ``calls``.
- ``BlockParser`` over ``Blocks``: the whole parser for formats whose calls are blocks of
  markup between fixed markers; the format gives only ``decode(body) -> Decoded``
  (raising ``MarkupError`` where the body does not decode).
- ``StreamParser``: the base of the JSON-body formats (a call object, a list of them, or
  bare arguments, streamed as their text grows); ``@next_char`` makes a state of one
  that decides on the next character after whitespace, waiting while there is none.
- ``call_events``: the three events of one whole call, for a parser that keeps its own
  bookkeeping; ``calls_from(events)``: the calls a list of events announces.
- The event and result types of ``mlxcel.types.toolcalls``, so one import serves.
- ``register(*formats)``: the ``mlxcel_register_tool_formats`` hook implementation that
  adds ``ToolFormat``s; a plugin module binds it to that name
  (``mlxcel_register_tool_formats = register(ToolFormat(...))``).

Every piece decides on the text seen so far only, never on where it was cut, so a parser
built from them gives the same events, merged, however the stream is cut: the rule
``mlxcel.testing.conformance.check_tool_format`` checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxcel.plugin_kit import adding
from mlxcel.text import first_of, partial_suffix
from mlxcel.toolcalls.api import ToolFormat
from mlxcel.toolcalls.json_bodies import next_char
from mlxcel.toolcalls.json_stream import NAME, StreamParser
from mlxcel.toolcalls.markup_stream import (
    BlockParser,
    Blocks,
    Decoded,
    MarkupError,
    TextStates,
    call_events,
    calls_from,
)
from mlxcel.types import toolcalls as _events

# the event and result types, re-exported so that a parser's imports come from one place
CallArguments, CallEnd, CallError = _events.CallArguments, _events.CallEnd, _events.CallError
CallStart, ParsedCall, ParseResult = _events.CallStart, _events.ParsedCall, _events.ParseResult
ToolEvent, ToolText = _events.ToolEvent, _events.ToolText

__all__ = [
    "NAME", "BlockParser", "Blocks", "CallArguments", "CallEnd", "CallError", "CallStart",
    "Decoded", "MarkupError", "ParseResult", "ParsedCall", "StreamParser", "TextStates",
    "ToolEvent", "ToolFormat", "ToolText", "call_events", "calls_from", "first_of", "next_char", "partial_suffix", "register",
]


def register(*formats: ToolFormat) -> Callable[[Any], None]:
    """A ``mlxcel_register_tool_formats`` hook implementation that adds ``formats``."""
    return adding("mlxcel_register_tool_formats", *formats)
