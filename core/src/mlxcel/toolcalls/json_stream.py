"""The streaming side shared by the builtin JSON-body tool formats.

A ``StreamParser`` is a small state machine over the answer text seen so far: each state
method consumes what it can from ``buf[pos:]`` and returns True to go on, False to wait
for more text (or, after ``finish()``, to stop). The base holds content back at a
possible marker, turns call objects, lists of them and bare argument objects into call
events as their text grows (``json_bodies``), keeps the bookkeeping (indices, the calls of
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

import json
import re
from typing import Any

from mlxcel.text import first_of, partial_suffix
from mlxcel.toolcalls.json_bodies import ENDS_INSIDE, JsonBodies
from mlxcel.toolcalls.json_scan import WHITESPACE, CallObject, JsonExtent
from mlxcel.types import toolcalls as ev

NAME = re.compile(r"[\w.\-]+")


class StreamParser(JsonBodies):
    """Base of the builtin JSON-body parsers; a subclass defines ``opens`` (the state after
    an opener), ``start`` where the answer may open with an unmarked call, and its keys and
    markers.

    ``resync``: markers that end a broken call's markup (taken into it); ``openers``:
    markers that begin the next call (a broken call's markup stops before one); ``plain``:
    markers that open a tentative call; ``dropped``: markup between calls, dropped;
    ``closer``: an optional marker that ends the calls' markup (``close_body``).
    """

    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    id_keys: tuple[str, ...] = ()
    resync: tuple[str, ...] = ()
    openers: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    closer = ""

    def __init__(self, tools: tuple[Any, ...] = ()) -> None:
        self.tool_names = frozenset(getattr(t, "name", t) for t in tools)
        self.buf, self.pos, self.mark = "", 0, -1
        self.final = self.tentative = False
        self.why = ENDS_INSIDE
        self.obj: CallObject | None = None
        self.value: JsonExtent | None = None
        self._keys = frozenset((*self.name_keys, *self.args_keys, *self.id_keys, "type"))
        self._skip_len = 0
        self._out: list[ev.ToolEvent] = []
        self._calls: list[ev.ParsedCall] = []
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
        """Content up to the next opener, which opens a call's markup (``opens``)."""
        found = self.scan((*self.openers, *self.plain, *self.dropped))
        if found is None or found in self.dropped:
            return found is not None
        self.opened(len(found), tentative=found in self.plain)
        self.state = self.opens(found)
        return True

    def opens(self, marker: str) -> Any:
        """The state that reads what ``marker`` (just consumed) opens."""
        raise NotImplementedError

    # --- the parser protocol -----------------------------------------------------------

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ev.ToolEvent]:
        self.buf += text
        self._run()
        out, self._out = self._out, []
        return out

    def finish(self) -> ev.ParseResult:
        self.final = True
        self._run()
        if self.pos < len(self.buf) or self.mark >= 0:
            self.eof()
        return ev.ParseResult(events=tuple(self._out), calls=tuple(self._calls))

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
        if self._out and type(self._out[-1]) is ev.ToolText:
            s = self._out.pop().text + s
        self._out.append(ev.ToolText(text=s))

    def go(self, found: Any, why: str, then: Any) -> bool:
        """A step's answer settles the state: ``found`` None (not yet) waits, False (not
        there) makes the markup broken (``why``), anything else moves on to ``then``."""
        if found is None:
            return self.wait()
        if found is False:
            return self.broken(why)
        self.state = then
        return True

    def begin_call(self, name: str | bool | None, why: str, then: Any) -> bool:
        """``go`` on a call's name (``head_name``'s answer): a name starts the call."""
        if isinstance(name, str):
            self.start_call(name)
        return self.go(name, why, then)

    def start_call(self, name: str, call_id: str | None = None) -> None:
        self._open_call, self._started = self._started, self._started + 1
        self._cur_name, self._cur_id, self._cur_args = name, call_id, []
        self.tentative = False
        self._out.append(ev.CallStart(index=self._open_call, name=name, id=call_id))

    def add_args(self, s: str) -> None:
        if s:
            self._cur_args.append(s)
            self._out.append(ev.CallArguments(index=self._open_call, text=s))

    def end_call(self, call_id: str | None = None) -> None:
        self._calls.append(ev.ParsedCall(name=self._cur_name,
                                      arguments="".join(self._cur_args),
                                      id=call_id or self._cur_id))
        self._out.append(ev.CallEnd(index=self._open_call))
        self._open_call, self._after_call, self._held_space = None, True, ""

    def whole_call(self, name: str, arguments: str) -> None:
        """A call decoded in one piece (formats whose bodies are not streamed)."""
        self.start_call(name)
        self.add_args(arguments)
        self.end_call()

    def fail(self, message: str, raw: str) -> None:
        """A broken call: the open one ends, and its markup comes back in a ``CallError``
        that names it."""
        broken = self._open_call
        if broken is not None:
            self._out.append(ev.CallEnd(index=broken))
            self._open_call = None
        self._out.append(ev.CallError(message=message, text=raw, index=broken))

    # --- reading text ----------------------------------------------------------------------

    def scan(self, markers: tuple[str, ...]) -> str | None:
        """Content up to the first of ``markers``: the marker found (consumed), or None
        when none is in the text so far (a possible beginning of one at the end is held,
        until ``finish()``)."""
        buf, pos = self.buf, self.pos
        at, found = first_of(buf, markers, pos)
        if at >= 0:
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

    def guess(self, then: Any) -> bool:
        """A call with no marker may start here (the answer's start): held from here,
        tentatively, and read by state ``then``."""
        self.mark, self.tentative, self._skip_len = self.pos, True, 0
        self.state = then
        return True

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
        """The answer ended: a tentative call is content, any other markup a ``CallError``."""
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

    def close_body(self) -> bool:
        """The optional ``closer`` (whitespace before it too), then ``done_body``."""
        if self.closer and self.match(self.closer, skip_space=True) is None:
            return self.wait()
        return self.done_body()

    def python_code(self) -> bool:
        """Code to the end of the answer (after Llama 3.1's ``<|python_tag|>``, ended by
        ``<|eom_id|>``): call ``python`` with ``{"code": ...}``, sent at the end."""
        if not self.final:
            return False
        code = self.buf[self.pos:].removesuffix("<|eom_id|>")
        self.whole_call("python", json.dumps({"code": code}, ensure_ascii=False))
        self.pos = len(self.buf)
        return self.done_body()
