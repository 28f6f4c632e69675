"""The streaming side shared by the builtin JSON-body tool formats.

A ``StreamParser`` is a small state machine over the answer text seen so far: each state
method consumes what it can from ``buf[pos:]`` and returns True to go on, False to wait
for more text (or, after ``finish()``, to stop). The base holds content back at a
possible marker, turns call objects, lists of them and bare argument objects into call
events as their text grows (``json_scan``), keeps the bookkeeping (indices, the calls of
the whole answer), and hands a broken call's markup back whole in a ``CallError``.

Three rules every format follows, so a stream and the whole text agree:

* a decision waits for the text that settles it, never for a chunk boundary;
* a call the text merely might be (JSON at the answer's start, a plain-text marker such
  as ``Action:``) is *tentative*: held, and given back as content if it turns out not to
  be one. Markup that a special token or a fixed wrapper opened is a call or a
  ``CallError``;
* the calls of ``finish()`` are the calls the events ended, each checked as JSON when it
  ended, so the authoritative parse is the stream's own and costs nothing extra.
"""

from __future__ import annotations

import re
from typing import Any

from mlxcel.builtin.toolcalls.json_scan import WHITESPACE, CallObject, JsonExtent, json_object
from mlxcel.engine.stops import partial_suffix
from mlxcel.types.toolcalls import (
    CallArguments,
    CallEnd,
    CallError,
    CallStart,
    ParsedCall,
    ParseResult,
    ToolEvent,
    ToolText,
)

MORE, DONE, BROKEN, ABORT = range(4)
ENDS_INSIDE = "the answer ends inside a tool call"
NAME = re.compile(r"[\w.\-]+")


class StreamParser:
    """Base of the builtin JSON-body parsers; a subclass defines ``start`` (the first state)
    and ``content`` (the state between calls), and its keys and markers.

    ``resync``: markers that end a broken call's markup (taken into it); ``openers``:
    markers that begin the next call (a broken call's markup stops before one).
    """

    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    id_keys: tuple[str, ...] = ()
    resync: tuple[str, ...] = ()
    openers: tuple[str, ...] = ()

    def __init__(self, tools: tuple[Any, ...] = ()) -> None:
        self.tool_names = frozenset(getattr(t, "name", t) for t in tools)
        self.buf, self.pos, self.mark = "", 0, -1
        self.final = self.tentative = False
        self.why = ENDS_INSIDE
        self.obj: CallObject | None = None
        self.value: JsonExtent | None = None
        self._keys = frozenset((*self.name_keys, *self.args_keys, *self.id_keys, "type"))
        self._skip_len = 0
        self._out: list[ToolEvent] = []
        self._calls: list[ParsedCall] = []
        self._open_call: int | None = None
        self._started = 0
        self._cur_name, self._cur_id, self._cur_args = "", None, []
        self._after_call, self._held_space = False, ""
        self._then = self._first = None
        self._vstart = self._vsent = 0
        self.state = self.start

    def start(self) -> bool:
        self.state = self.content
        return True

    def content(self) -> bool:
        raise NotImplementedError

    # --- the parser protocol -----------------------------------------------------------

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ToolEvent]:
        self.buf += text
        self._run()
        out, self._out = self._out, []
        return out

    def finish(self) -> ParseResult:
        self.final = True
        self._run()
        if self.pos < len(self.buf) or self.mark >= 0:
            self.eof()
        return ParseResult(events=tuple(self._out), calls=tuple(self._calls))

    def _run(self) -> None:
        while self.state():
            pass
        if self.mark < 0 and self.pos:
            self.buf, self.pos = self.buf[self.pos:], 0

    # --- events --------------------------------------------------------------------------

    def text(self, s: str) -> None:
        """Content; whitespace right after a call is held, and dropped if a call or the
        end follows (the newline a template writes between calls is markup)."""
        if not s:
            return
        if self._after_call:
            if s.isspace():
                self._held_space += s
                return
            s, self._held_space, self._after_call = self._held_space + s, "", False
        if self._out and type(self._out[-1]) is ToolText:
            s = self._out.pop().text + s
        self._out.append(ToolText(text=s))

    def start_call(self, name: str, call_id: str | None = None) -> None:
        self._open_call, self._started = self._started, self._started + 1
        self._cur_name, self._cur_id, self._cur_args = name, call_id, []
        self.tentative = False
        self._out.append(CallStart(index=self._open_call, name=name, id=call_id))

    def add_args(self, s: str) -> None:
        if s:
            self._cur_args.append(s)
            self._out.append(CallArguments(index=self._open_call, text=s))

    def end_call(self, call_id: str | None = None) -> None:
        self._calls.append(ParsedCall(name=self._cur_name,
                                      arguments="".join(self._cur_args),
                                      id=call_id or self._cur_id))
        self._out.append(CallEnd(index=self._open_call))
        self._open_call, self._after_call, self._held_space = None, True, ""

    def whole_call(self, name: str, arguments: str) -> None:
        """A call decoded in one piece (formats whose bodies are not streamed)."""
        self.start_call(name)
        self.add_args(arguments)
        self.end_call()

    def fail(self, message: str, raw: str) -> None:
        """A broken call: the open one ends, and its markup comes back in a CallError."""
        if self._open_call is not None:
            self._out.append(CallEnd(index=self._open_call))
            self._open_call = None
        self._out.append(CallError(message=message, text=raw))

    # --- reading text ----------------------------------------------------------------------

    def scan(self, markers: tuple[str, ...]) -> str | None:
        """Content up to the first of ``markers``: the marker found (consumed), or None
        when none is in the text so far (a possible beginning of one at the end is held,
        until ``finish()``)."""
        buf, pos = self.buf, self.pos
        at, found = -1, None
        for m in markers:
            j = buf.find(m, pos)
            if j >= 0 and (at < 0 or j < at or (j == at and len(m) > len(found))):
                at, found = j, m
        if found is not None:
            self.text(buf[pos:at])
            self.pos = at + len(found)
            return found
        keep = 0 if self.final else min(partial_suffix(buf, markers), len(buf) - pos)
        self.text(buf[pos:len(buf) - keep])
        self.pos = len(buf) - keep
        return None

    def opened(self, length: int, tentative: bool = False) -> None:
        """A marker of ``length`` just consumed opens a call: markup from here on."""
        self.mark, self._held_space = self.pos - length, ""
        self.tentative, self._skip_len = tentative, length if tentative else 0

    def guess(self) -> None:
        """The answer's start may be a call with no marker: held from here, tentatively."""
        self.mark, self.tentative, self._skip_len = self.pos, True, 0

    def peek(self) -> str | None:
        """The next character after whitespace (consumed), or None if the text ends first."""
        buf, i = self.buf, self.pos
        while i < len(buf) and buf[i] in WHITESPACE:
            i += 1
        self.pos = i
        return buf[i] if i < len(buf) else None

    def match(self, marker: str, skip_space: bool = False) -> bool | None:
        """Whether ``marker`` is next (consumed if so; whitespace before it too, with
        ``skip_space``); None while the text so far could still begin it."""
        i = self.pos
        if skip_space:
            while i < len(self.buf) and self.buf[i] in WHITESPACE:
                i += 1
        rest = self.buf[i:i + len(marker)]
        if rest == marker:
            self.pos = i + len(marker)
            return True
        return None if marker.startswith(rest) and not self.final else False

    def name_before(self, stop: str, limit: int = 256) -> str | bool | None:
        """A function name written up to ``stop`` (``pos`` moves onto ``stop``): None while
        the text so far could still be one, False once it cannot."""
        j = self.buf.find(stop, self.pos)
        head = (self.buf[self.pos:j] if j >= 0 else self.buf[self.pos:]).strip()
        valid = NAME.fullmatch(head) is not None
        if j < 0:
            return None if (valid or not head) and len(head) < limit and not self.final \
                else False
        if not valid:
            return False
        self.pos = j
        return head

    def wait(self) -> bool:
        """No more to do until more text comes; at the end, the held text is settled."""
        return self.eof() if self.final else False

    def eof(self) -> bool:
        """The answer ended: a tentative call is content, any other markup a CallError."""
        if self.tentative or self.mark < 0:
            self.text(self.buf[self.mark if self.tentative and self.mark >= 0 else self.pos:])
        else:
            self.fail(self.why, self.buf[self.mark:])
        self.pos, self.mark, self.tentative = len(self.buf), -1, False
        self.obj = self.value = None
        self.state = self._stopped
        return False

    def _stopped(self) -> bool:
        return False

    def abort(self) -> bool:
        """A tentative call is not one: its text, from the mark on, is content."""
        if self._skip_len:
            self.text(self.buf[self.mark:self.mark + self._skip_len])
        self.pos, self.mark = self.mark + self._skip_len, -1
        self.obj, self.tentative, self._skip_len = None, False, 0
        self.state = self.content
        return True

    def broken(self, message: str) -> bool:
        """Not a call: content if it was only a guess, else markup to hand back whole."""
        if self.tentative:
            return self.abort()
        self.why, self.obj, self.value = message, None, None
        self.state = self._resync
        return True

    def _resync(self) -> bool:
        buf, at, end = self.buf, -1, -1
        for markers, taken in ((self.resync, True), (self.openers, False)):
            for m in markers:
                j = buf.find(m, self.pos)
                if j >= 0 and (at < 0 or j < at):
                    at, end = j, j + len(m) if taken else j
        if at < 0:
            if not self.final:
                return False
            end = len(buf)
        self.fail(self.why, buf[self.mark:end])
        self.pos, self.mark, self.why = end, -1, ENDS_INSIDE
        self.state = self.content
        return True

    def done_body(self) -> bool:
        """The calls' markup is over: back to content."""
        self.mark = -1
        self.state = self.content
        return True

    # --- call objects, lists of them, bare argument objects ---------------------------------

    def objects(self, then: Any, tentative: bool = False) -> bool:
        """Read one call object, then go to state ``then``."""
        self._begin(tentative)
        self._then, self.state = then, self._one_object
        return True

    def items(self, then: Any, tentative: bool = False) -> bool:
        """Read a list of call objects (its ``[`` consumed), then go to state ``then``."""
        self._then, self._first, self.tentative = then, True, tentative
        self.state = self._list_item
        return True

    def _begin(self, tentative: bool) -> None:
        self.obj = CallObject(self.pos, self.name_keys, self.args_keys, self.id_keys)
        self.tentative = tentative

    def pump_object(self) -> int:
        """Advance the call object: MORE (wants text), DONE, BROKEN (``why``) or ABORT (a
        tentative one is not a call). The object pauses at its first key and its name, so
        the call starts at the same point of the text however the text was cut."""
        obj = self.obj
        while True:
            self.pos = obj.advance(self.buf, self.pos)
            if self._open_call is None and obj.error is None:
                if obj.name is not None:
                    if self.tentative and self.tool_names and obj.name not in self.tool_names:
                        return ABORT
                    self.start_call(obj.name, obj.start_id)
                elif self.tentative and obj.first_key not in (None, *self._keys):
                    return ABORT
            if self._open_call is not None:
                self.add_args(obj.take())
            if not obj.paused:
                break
            obj.paused = False
        if obj.error is not None:
            self.why = obj.error
            return ABORT if self.tentative else BROKEN
        if obj.end >= 0:
            self.obj = None
            self.end_call(obj.id)
            return DONE
        if self.final:
            return ABORT if self.tentative else BROKEN
        return MORE

    def _one_object(self) -> bool:
        r = self.pump_object()
        if r == MORE:
            return False
        if r == DONE:
            self.state = self._then
            return True
        return self.abort() if r == ABORT else self.broken(self.why)

    def _list_item(self) -> bool:
        c = self.peek()
        if c is None:
            return self.wait()
        if c == "{":
            self._begin(self.tentative and self._first)
            self.state = self._list_object
            return True
        if c == "]" and self._first and not self.tentative:
            self.pos += 1
            self.state = self._then
            return True
        return self.broken("a tool-call list holds something other than a call object")

    def _list_object(self) -> bool:
        r = self.pump_object()
        if r == MORE:
            return False
        if r == DONE:
            self.state = self._list_next
            return True
        return self.abort() if r == ABORT else self.broken(self.why)

    def _list_next(self) -> bool:
        c = self.peek()
        if c is None:  # an unclosed list: its whole calls stand
            self.state = self._then if self.final else self.state
            return self.final
        self.pos += 1
        if c == ",":
            self.mark, self._first, self.state = self.pos, False, self._list_item
            return True
        if c == "]":
            self.state = self._then
            return True
        self.pos -= 1
        return self.broken("a tool-call list goes on past a call without a comma")

    def begin_value(self) -> None:
        """A bare arguments object starts at ``pos`` (its call already started)."""
        self.value = JsonExtent("{")
        self._vstart = self._vsent = self.pos

    def pump_value(self) -> int:
        value = self.value
        self.pos = value.advance(self.buf, self.pos)
        stop = self.pos if value.end < 0 else value.end
        self.add_args(self.buf[self._vsent:stop])
        self._vsent = stop
        if value.end >= 0:
            self.value = None
            if not json_object(self.buf[self._vstart:value.end]):
                self.why = "the call's arguments are not a JSON object"
                return BROKEN
            self.end_call()
            return DONE
        return BROKEN if self.final else MORE
