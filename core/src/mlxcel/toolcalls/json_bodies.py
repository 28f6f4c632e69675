"""The JSON bodies of the builtin JSON-body tool formats: call objects, lists of them and
bare arguments objects, turned into call events as their text grows (``json_scan``).

``JsonBodies`` is the part of ``json_stream.StreamParser`` that reads them: a state method
of a format calls ``json_calls``, ``objects``, ``items`` or ``arguments`` with the state
that follows the body. The text, the position and the events are the parser's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxcel.toolcalls.json_scan import CallObject, JsonExtent, json_object

MORE, DONE, BROKEN, ABORT = range(4)
ENDS_INSIDE = "the answer ends inside a tool call"


def next_char(state: Callable[[Any, str], bool]) -> Callable[[Any], bool]:
    """A ``StreamParser`` state that decides on the next character after whitespace
    (``state(self, c)``); it waits (``wait()``) while the text has none yet."""

    def run(self: Any) -> bool:
        c = self.peek()
        return self.wait() if c is None else state(self, c)

    return run


class JsonBodies:
    """The JSON-body states of a ``StreamParser`` (which defines every attribute and
    method used here but these)."""

    def json_calls(self, then: Any, tentative: bool = False) -> bool | None:
        """A list of call objects or one call object next (after whitespace): read it,
        then go to state ``then``; None when something else is next (at ``pos``)."""
        c = self.peek()
        if c is None:
            return self.wait()
        if c == "[":
            self.pos += 1
            return self.items(then=then, tentative=tentative)
        if c == "{":
            return self.objects(then=then, tentative=tentative)
        return None

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
        return self._object_then(self._then)

    def _object_then(self, then: Any) -> bool:
        r = self.pump_object()
        if r == MORE:
            return False
        if r == DONE:
            self.state = then
            return True
        return self.abort() if r == ABORT else self.broken(self.why)

    @next_char
    def _list_item(self, c: str) -> bool:
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
        return self._object_then(self._list_next)

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

    def arguments(self, then: Any, missing: str, call: str | None = None) -> bool:
        """A bare arguments object next: streamed, then state ``then``; its call started,
        or ``call`` starts at its ``{``. ``missing``: why the markup is broken (or, for a
        tentative call, not a call) when something else is next."""
        if self.value is None:
            c = self.peek()
            if c is None:
                return self.wait()
            if c != "{":
                return self.broken(missing)
            if call is not None:
                self.start_call(call)
            self.value = JsonExtent("{")
            self._vstart = self._vsent = self.pos
        r = self._pump_value()
        if r == MORE:
            return False
        if r != DONE:
            return self.broken(self.why)
        self.state = then
        return True

    def _pump_value(self) -> int:
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
