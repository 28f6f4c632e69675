"""The streaming layer of the tool-call formats whose calls are blocks of markup.

A format is a ``Blocks``: the markers around one call (``unit``), optionally the markers
of a section that holds several calls (Kimi K2's ``<|tool_calls_section_begin|>``,
MiniMax's ``<minimax:tool_call>``), and ``decode(body)``, which turns the markup between a
call's markers into its name, arguments and id. ``BlockParser`` applies the rules that
the spec gives every such format, so that each format module only decodes:

- text outside markup is answer text, sent as soon as it cannot be the start of an
  opening marker (a partial marker at a token boundary is held until the next text);
- a call is decoded once its closing marker arrives, or at ``finish()`` when the answer
  ends inside it (a stop token ends many formats' last call), and sent whole: one
  ``CallStart``, one ``CallArguments``, one ``CallEnd``;
- markup that does not decode is one ``CallError`` holding all of its text, so nothing of
  the answer is lost; when a failed call's body holds another opening marker, the text
  before it is the error and decoding resumes there (a marker quoted in prose before a
  real call does not swallow that call);
- whitespace between calls and after the last is dropped; other text after a call is
  answer text.

Every decision depends on the text seen so far only, never on where it was cut, so the
events, merged, are the same for any chunking. ``finish().calls`` are the calls the events
announced, which is the parse of the whole answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mlxcel.text import first_of, partial_suffix
from mlxcel.types import toolcalls as ev


class MarkupError(ValueError):
    """A call's markup does not decode; the message says why (the server logs it)."""


class Decoded(NamedTuple):
    """One decoded call: ``arguments`` is a JSON object's text."""

    name: str
    arguments: str
    id: str | None = None


class Blocks(NamedTuple):
    """A markup format's markers and decoder (see the module docstring).

    ``section``: (openers, closers) of the block that holds calls, or None. ``bare``: a
    call's ``unit`` opener counts outside a section too (else it is plain text there)."""

    unit: tuple[str, str]
    decode: Callable[[str], Decoded]
    section: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    bare: bool = True


def call_events(index: int, call: Decoded) -> list[ev.ToolEvent]:
    """A whole call's events, in the order a stream sends them: start, arguments, end."""
    return [ev.CallStart(index=index, name=call.name, id=call.id),
            ev.CallArguments(index=index, text=call.arguments), ev.CallEnd(index=index)]


def calls_from(events: list[ev.ToolEvent]) -> tuple[ev.ParsedCall, ...]:
    """The calls that ``events`` announce, each with its arguments' fragments joined: the
    parse of the whole answer for a parser whose ``finish()`` replays it."""
    calls: list[list] = []
    for event in events:
        if isinstance(event, ev.CallStart):
            calls.append([event.name, "", event.id])
        elif isinstance(event, ev.CallArguments):
            calls[event.index][1] += event.text
    return tuple(ev.ParsedCall(name=name, arguments=arguments, id=call_id)
                 for name, arguments, call_id in calls)


class TextStates:
    """A parser whose states are methods ``_<state>(events)`` over the held text: each
    settles what it can and returns True to go on, False to wait for more text. ``calls``:
    the calls sent so far, the parse of the whole answer at ``finish()``."""

    def __init__(self, state: str) -> None:
        self.state, self.buf, self.scan = state, "", 0
        self.calls: list[ev.ParsedCall] = []

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ev.ToolEvent]:
        """The events ``text`` settles (token ids are not needed: markers are text)."""
        self.buf += text
        events: list[ev.ToolEvent] = []
        while getattr(self, f"_{self.state}")(events):
            pass
        return events

    def text_until(self, events: list[ev.ToolEvent], openers: tuple[str, ...]) -> str:
        """Send the held text up to the first of ``openers`` as answer text and drop the
        opener: the opener, or "" when none is there yet (a possible partial opener at the
        end stays held, so the next text settles it)."""
        at, marker = first_of(self.buf, openers)
        cut = len(self.buf) - partial_suffix(self.buf, openers) if at < 0 else at
        if cut:
            events.append(ev.ToolText(text=self.buf[:cut]))
        self.buf = self.buf[cut + len(marker):]
        return marker

    def send(self, events: list[ev.ToolEvent], call: Decoded) -> None:
        """A whole call's events, in the order a stream sends them."""
        events += call_events(len(self.calls), call)
        self.calls.append(ev.ParsedCall(name=call.name, arguments=call.arguments, id=call.id))


class BlockParser(TextStates):
    """One answer's parser for a ``Blocks`` format. States: ``text`` (outside markup),
    ``section`` (inside a section, between calls), ``unit`` (inside one call)."""

    def __init__(self, blocks: Blocks) -> None:
        super().__init__("text")
        self.blocks = blocks
        openers, self._closers = blocks.section or ((), ())
        self._section_openers = openers
        self._openers = (*openers, blocks.unit[0]) if blocks.bare or not openers else openers
        self._in_section = False
        self._fresh = ""  # a section's opener, until a call or an error comes out of it
        self._gap = ""  # whitespace after a call: dropped if a call or the end follows
        self._after_call = False

    def finish(self) -> ev.ParseResult:
        """Held text is answer text; an open call is decoded as it stands (or is a
        ``CallError``); every call of the answer."""
        events: list[ev.ToolEvent] = []
        buf, self.buf = self.buf, ""
        if self.state == "text":
            self._answer(events, buf)
        elif self.state == "section":
            if buf.strip() or self._fresh:
                events.append(ev.CallError(message="a section of calls is not closed",
                                        text=self._fresh + buf))
        else:
            self._close(events, buf, "")
        self.state = "text"
        return ev.ParseResult(events=tuple(events), calls=tuple(self.calls))

    def _answer(self, events: list[ev.ToolEvent], text: str) -> None:
        """Answer text; after a call, whitespace waits to see what follows it."""
        if not text:
            return
        if self._after_call and not text.strip():
            self._gap += text
            return
        events.append(ev.ToolText(text=self._gap + text))
        self._gap, self._after_call = "", False

    def _text(self, events: list[ev.ToolEvent]) -> bool:
        at, marker = first_of(self.buf, self._openers)
        if at < 0:
            keep = partial_suffix(self.buf, self._openers)
            self._answer(events, self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        self._answer(events, self.buf[:at])
        self._gap, self.buf, self.scan = "", self.buf[at + len(marker):], 0
        if marker in self._section_openers:
            self.state, self._in_section, self._fresh = "section", True, marker
        else:
            self.state, self._in_section = "unit", False
        return True

    def _section(self, events: list[ev.ToolEvent]) -> bool:
        at, marker = self._find((self.blocks.unit[0], *self._closers))
        if at < 0:
            return False
        junk, self.buf = self.buf[:at], self.buf[at + len(marker):]
        if junk.strip():
            events.append(ev.CallError(message="text between calls", text=self._fresh + junk))
            self._fresh = ""
        if marker == self.blocks.unit[0]:
            self.state, self._fresh = "unit", ""
        else:
            self.state, self._in_section, self._after_call = "text", False, True
            self._fresh = ""
        return True

    def _unit(self, events: list[ev.ToolEvent]) -> bool:
        closers = (self.blocks.unit[1], *(self._closers if self._in_section else ()))
        at, marker = self._find(closers)
        if at < 0:
            return False
        body, self.buf = self.buf[:at], self.buf[at + len(marker):]
        self._close(events, body, marker)
        if marker == self.blocks.unit[1] and self._in_section:
            self.state = "section"
        else:
            self.state, self._in_section, self._after_call = "text", False, True
        return True

    def _find(self, markers: tuple[str, ...]) -> tuple[int, str]:
        """Search the held text from where the last search left off."""
        at, marker = first_of(self.buf, markers, self.scan)
        if at < 0:
            self.scan = max(0, len(self.buf) - max(map(len, markers)) + 1)
        else:
            self.scan = 0
        return at, marker

    def _close(self, events: list[ev.ToolEvent], body: str, closer: str) -> None:
        """Decode one call's body: its events, or a ``CallError`` with all its text. A
        body that fails and holds another opener is two: the text before that opener
        (a call whose closer was left out, or an error), then the rest."""
        opener = self.blocks.unit[0]
        while (error := self._decode(events, body)) is not None:
            inner = body.find(opener)
            if inner < 0:
                events.append(ev.CallError(message=error, text=opener + body + closer))
                return
            head, body = body[:inner], body[inner + len(opener):]
            if (error := self._decode(events, head)) is not None:
                events.append(ev.CallError(message=error, text=opener + head))

    def _decode(self, events: list[ev.ToolEvent], body: str) -> str | None:
        """A decoded call's events, or why the body does not decode."""
        try:
            call = self.blocks.decode(body)
        except (ValueError, LookupError, RecursionError) as exc:  # MarkupError and kin
            return str(exc) or type(exc).__name__
        self.send(events, call)
        return None
