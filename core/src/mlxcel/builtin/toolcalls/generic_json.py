"""Generic JSON: the whole answer is one call, ``{"name": ..., "arguments": {...}}``, or a
list of them, or llama-server's generic shape, ``{"tool_calls": [call, ...]}`` (or
``{"tool_call": call}``), optionally with more members after the calls (``"content"``,
whose text is the answer's content).

The fallback for templates that ask for bare JSON calls, and for templates that render no
tool calls at all: the chat layer shows those their earlier calls in the generic shape
(``mlxcel.chat.adapt``), so the model answers in it. Nothing marks a call, so the JSON is
tentative until its first key and name say it is one (a name the request does not
declare, when it declares any, is content); after the first call of a list, the rest of
the list is calls. Calls stream as the other JSON formats' do; text after the JSON is
content.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.toolcalls.json_scan import WHITESPACE, JsonExtent
from mlxcel.toolcalls.kit import StreamParser

_KEYS = ('"tool_calls"', '"tool_call"')


def _wrapper(buf: str, i: int, final: bool) -> tuple[str, int] | bool | None:
    """At ``i`` (a ``{``): the generic wrapper's opener, ``{"tool_calls": [`` or
    ``{"tool_call": {``, and where its call(s) begin; False when it is not one; None while
    the text so far could still be one."""
    j = i + 1
    while j < len(buf) and buf[j] in WHITESPACE:
        j += 1
    for key in _KEYS:
        if buf.startswith(key, j):
            return _wrapper_tail(buf, j + len(key), key, final)
    rest = buf[j:]
    if not final and any(len(rest) < len(k) and k.startswith(rest) for k in _KEYS):
        return None
    return False


def _wrapper_tail(buf: str, j: int, key: str, final: bool) -> tuple[str, int] | bool | None:
    n = len(buf)
    for want in (":", "[" if key == _KEYS[0] else "{"):
        while j < n and buf[j] in WHITESPACE:
            j += 1
        if j >= n:
            return False if final else None
        if buf[j] != want:
            return False
        j += 1
    return key, j - 1


class GenericJsonParser(StreamParser):
    def start(self) -> bool:
        return self.guess(self._lead)

    def _lead(self) -> bool:
        if self.peek() == "{":
            found = _wrapper(self.buf, self.pos, self.final)
            if found is None:
                return self.wait()
            if found:
                key, at = found
                self.pos = at
                if key == _KEYS[0]:
                    self.pos += 1
                    return self.items(then=self._rest, tentative=True)
                return self.objects(then=self._rest, tentative=True)
        read = self.json_calls(then=self.done_body, tentative=True)
        return self.abort() if read is None else read

    def _rest(self) -> bool:
        """After the wrapper's calls: its closing ``}``, or more members, whose
        ``content`` is the answer's text."""
        if self.value is None:
            c = self.peek()
            if c is None:
                return self.wait()
            if c == "}":
                self.pos += 1
                return self.done_body()
            if c != ",":
                return self.broken("the tool_calls object goes on without a comma")
            self.value, self._vstart = JsonExtent("{"), self.pos + 1
            self.value.depth = 1
        self.pos = self.value.advance(self.buf, self.pos)
        if self.value.end < 0:
            return self.wait()
        tail = "{" + self.buf[self._vstart:self.value.end]
        self.value = None
        try:
            members = json.loads(tail)
        except ValueError:
            return self.broken("the tool_calls object does not parse")
        content = members.get("content") if isinstance(members, dict) else None
        self.done_body()
        if isinstance(content, str):
            self.text(content)
        return True


def new_parser(tools: tuple[Any, ...] = ()) -> GenericJsonParser:
    return GenericJsonParser(tools)
