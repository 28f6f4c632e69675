"""Incremental JSON scanning for tool-call bodies: where one JSON value ends, and a call
object read as it grows.

Both read a text that only ever grows, from an index, and never re-read what they passed,
so a parser can hand them each new piece of a stream: strings (escapes included) and
nesting are tracked, so a brace or a marker inside a string never counts. Neither builds
values: a call's arguments stay the model's own text (key order, whitespace and number
spelling kept), which the spec asks of every JSON body.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

WHITESPACE = " \t\r\n"
_OUTSIDE = re.compile(r'[{}\[\]"]')
_INSIDE = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[,}\]\s;)]")
_decode = msgspec.json.decode


class BracketExtent:
    """Where a bracketed expression ends as its text grows: strings in one of ``QUOTES``
    (backslash escapes inside) are skipped, ``OPENERS`` and the other brackets counted.
    ``end`` is the index just past it once whole (-1 before); a string that closes outside
    any bracket is whole too. Brackets are counted, not matched: the caller parses the
    finished text, which catches a mismatch."""

    __slots__ = ("depth", "end", "escape", "quote")
    QUOTES = '"'
    OPENERS = "{["
    OUTSIDE = _OUTSIDE  # a quote or a bracket
    INSIDE = {'"': _INSIDE}  # per quote: the quote or a backslash

    def __init__(self) -> None:
        self.depth, self.quote, self.escape, self.end = 0, "", False, -1

    def advance(self, text: str, i: int) -> int:
        """Scan on from ``i``; how far the scan got."""
        n = len(text)
        while i < n:
            if self.escape:
                self.escape, i = False, i + 1
            elif self.quote:
                m = self.INSIDE[self.quote].search(text, i)
                if m is None:
                    return n
                i = m.start() + 1
                if text[i - 1] == "\\":
                    self.escape = True
                    continue
                self.quote = ""
                if self.depth == 0:
                    self.end = i
                    return i
            else:
                m = self.OUTSIDE.search(text, i)
                if m is None:
                    return n
                c, i = m.group(), m.start() + 1
                if c in self.QUOTES:
                    self.quote = c
                    continue
                self.depth += 1 if c in self.OPENERS else -1
                if self.depth <= 0:
                    self.end = i
                    return i
        return n


class JsonExtent(BracketExtent):
    """The extent of one JSON value that starts with ``first`` (its first character): a
    ``BracketExtent``, except that a bare number or literal ends where a delimiter follows
    it, since ``1`` may still become ``10``."""

    __slots__ = ("scalar",)

    def __init__(self, first: str) -> None:
        super().__init__()
        self.scalar = first not in '{["'

    @property
    def in_string(self) -> bool:
        return bool(self.quote)

    @in_string.setter
    def in_string(self, inside: bool) -> None:
        self.quote = '"' if inside else ""

    def advance(self, text: str, i: int) -> int:
        if not self.scalar:
            return super().advance(text, i)
        m = _SCALAR_END.search(text, i)
        if m is None:
            return len(text)
        self.end = m.start()
        return self.end


def _after_space(step: Callable[..., int | None]) -> Callable[..., int | None]:
    """A ``CallObject`` step that begins at the next character that is not whitespace;
    None (wait for more text) while there is none."""

    def run(self: Any, text: str, i: int) -> int | None:
        while i < len(text) and text[i] in WHITESPACE:
            i += 1
        return step(self, text, i) if i < len(text) else None

    return run


class CallObject:
    """One call object, ``{"name": "f", "arguments": {...}}``, read as it grows.

    ``name`` is set once the name's string is whole; ``take()`` hands out the arguments'
    text written since the last take (verbatim for an object, the decoded text for a string
    value, ``{}`` for null or no arguments); ``end`` is the index past the closing brace,
    once the whole object has decoded as JSON; ``error`` says why it is not a call.
    ``first_key`` lets a caller that only guessed at a call give up early; ``start_id``
    is the id written before the name, if any. Keys: the
    format's spellings of the name, the arguments and the id; others are skipped.
    """

    def __init__(self, start: int, name_keys: tuple[str, ...], args_keys: tuple[str, ...],
                 id_keys: tuple[str, ...] = ()) -> None:
        self.start = start
        self.keys = (name_keys, args_keys, id_keys)
        self.name: str | None = None
        self.id: str | None = None
        self.first_key: str | None = None
        self.start_id: str | None = None
        self.paused = False
        self.error: str | None = None
        self.end = -1
        self._step = self._open
        self._key: str | None = None
        self._value: JsonExtent | None = None
        self._vstart = self._sent = 0
        self._pending: list[str] = []
        self._has_args = False

    def take(self) -> str:
        out, self._pending = "".join(self._pending), []
        return out

    def advance(self, text: str, i: int) -> int:
        """Read on from ``i``; stops early (``paused``) right after the first key and the
        name, so a caller sees each at the same point of the text however it was cut."""
        while self.end < 0 and self.error is None and not self.paused:
            j = self._step(text, i)
            if j is None:
                return i
            i = j
        return i

    def _fail(self, message: str, i: int) -> int:
        self.error = message
        return i

    def _expect(self, text: str, i: int, char: str, then: Callable[..., int | None],
                error: str) -> int:
        """Step past ``char`` at ``i`` on to the step ``then``; anything else: ``error``."""
        if text[i] != char:
            return self._fail(error, i)
        self._step = then
        return i + 1

    def _open(self, text: str, i: int) -> int | None:
        return self._expect(text, i, "{", self._key_start, "a call is not a JSON object")

    @_after_space
    def _key_start(self, text: str, i: int) -> int | None:
        if text[i] == "}":
            return self._close(text, i + 1)
        if text[i] != '"':
            return self._fail("a key of the call object is not a string", i)
        self._vstart, self._value, self._step = i, JsonExtent('"'), self._key_body
        self._value.in_string = True
        return i + 1

    def _key_body(self, text: str, i: int) -> int | None:
        j = self._value.advance(text, i)
        if self._value.end < 0:
            return j if j > i else None
        try:
            self._key = _decode(text[self._vstart:self._value.end])
        except msgspec.DecodeError:
            return self._fail("a key of the call object is not a valid string", i)
        if self.first_key is None:
            self.first_key, self.paused = self._key, True
        self._step = self._colon
        return self._value.end

    @_after_space
    def _colon(self, text: str, i: int) -> int | None:
        return self._expect(text, i, ":", self._value_start,
                            "a key of the call object has no value")

    @_after_space
    def _value_start(self, text: str, i: int) -> int | None:
        self._vstart = self._sent = i
        self._value, self._step = JsonExtent(text[i]), self._value_body
        if self._key in self.keys[1]:
            if self._has_args:
                return self._fail("the call has its arguments twice", i)
            self._has_args = True
        return i

    def _value_body(self, text: str, i: int) -> int | None:
        j = self._value.advance(text, i)
        streamed = self._key in self.keys[1] and text[self._vstart] == "{"
        if streamed:
            stop = j if self._value.end < 0 else self._value.end
            self._pending.append(text[self._sent:stop])
            self._sent = stop
        if self._value.end < 0:
            return j if j > i else None
        self._step = self._next
        return self._settle(text[self._vstart:self._value.end], streamed, self._value.end)

    def _settle(self, raw: str, streamed: bool, i: int) -> int:
        """A whole value: the name, the id, or arguments that were not streamed."""
        names, args, ids = self.keys
        if self._key in names or self._key in ids or (self._key in args and not streamed):
            try:
                value = _decode(raw)
            except msgspec.DecodeError:
                return self._fail(f"the value of {self._key!r} is not JSON", i)
            if self._key in names:
                if not isinstance(value, str) or not value:
                    return self._fail("the call's name is not a string", i)
                if self.name is None:
                    self.name, self.start_id, self.paused = value, self.id, True
            elif self._key in ids:
                self.id = value if isinstance(value, str) else self.id
            elif isinstance(value, str):
                self._pending.append(value)
            elif value is None:
                self._pending.append("{}")
            else:
                return self._fail("the call's arguments are not an object", i)
        return i

    @_after_space
    def _next(self, text: str, i: int) -> int | None:
        if text[i] == ",":
            self._step = self._key_start
            return i + 1
        if text[i] == "}":
            return self._close(text, i + 1)
        return self._fail("the call object goes on past a value", i)

    def _close(self, text: str, i: int) -> int:
        try:
            _decode(text[self.start:i])
        except msgspec.DecodeError:
            return self._fail("the call object is not valid JSON", i)
        if self.name is None:
            return self._fail("the call object has no name", i)
        if not self._has_args:
            self._pending.append("{}")
        self.end = i
        return i


def json_object(raw: str) -> bool:
    """Whether ``raw`` decodes as a JSON object (an arguments body read by extent)."""
    try:
        return isinstance(_decode(raw), dict)
    except msgspec.DecodeError:
        return False
