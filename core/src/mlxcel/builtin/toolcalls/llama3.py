"""Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": ..., "parameters": {...}}``, the whole answer
(optionally after ``<|python_tag|>``), several separated by ``;`` (or written as a JSON list).

Without ``<|python_tag|>`` nothing marks a call, so JSON at the answer's start is a
tentative call: held until its first key (not a call key: content), then its name (not a
declared tool, when the request declares any: content). ``<|python_tag|>`` is a special
token, so what follows it is a call or a ``CallError``:

* ``{...}``: a JSON call, streamed like the bare one;
* ``NAME.call(k="v", ...)``: a built-in tool (``brave_search``, ``wolfram_alpha``, as the
  template renders ``builtin_tools``): call ``NAME`` with the keyword arguments as a JSON
  object, sent whole when its ``)`` arrives. The template renders a call back in this form
  whenever its name is in ``builtin_tools``, so the next turn round-trips;
* anything else is ``code_interpreter`` code, which runs to the end of the answer (the
  model ends it with ``<|eom_id|>``): call ``python`` with ``{"code": ...}``, the name
  llama.cpp and Functionary give it, sent at the end.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlxcel.builtin.toolcalls.json_stream import StreamParser
from mlxcel.builtin.toolcalls.py_calls import PyExtent, builtin_call

TAG = "<|python_tag|>"
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\(")
_BUILTIN_PREFIX = re.compile(r"[A-Za-z_]\w*(\.(c(a(l(l\(?)?)?)?)?)?")


class Llama3Parser(StreamParser):
    openers = (TAG,)

    def start(self) -> bool:
        self.guess()
        self.state = self._lead
        return True

    def _lead(self) -> bool:
        """The answer's start, or what follows a ``;``: a call, or else content."""
        c = self.peek()
        if c is None:
            if self.final and self.buf.startswith(";", self.mark):
                self.mark, self.tentative = -1, False  # a trailing separator is markup
            return self.wait()
        if c == "{":
            return self.objects(then=self._after, tentative=True)
        if c == "[":  # some Llama-based templates ask for a JSON list of calls
            self.pos += 1
            return self.items(then=self._after, tentative=True)
        found = self.match(TAG) if c == "<" else False
        if found is None:
            return self.wait()
        if found:
            self.opened(len(TAG))
            self.state = self._tagged
            return True
        return self.abort()

    def content(self) -> bool:
        if self.scan(self.openers) is None:
            return False
        self.opened(len(TAG))
        self.state = self._tagged
        return True

    def _tagged(self) -> bool:
        c = self.peek()
        if c is None:
            return self.wait()
        if c == "{":
            return self.objects(then=self._after)
        if m := _BUILTIN.match(self.buf, self.pos):
            self._call, self._extent = m.group(1), PyExtent()
            self._from, self.pos, self.state = self.pos, m.end() - 1, self._builtin
            return True
        if _BUILTIN_PREFIX.fullmatch(self.buf, self.pos) and not self.final:
            return False
        self.state = self._code
        return True

    def _builtin(self) -> bool:
        self.pos = self._extent.advance(self.buf, self.pos)
        if self._extent.end < 0:
            return self.wait()
        try:
            name, arguments = builtin_call(self.buf[self._from:self.pos])
        except ValueError as exc:
            return self.broken(str(exc))
        self.whole_call(name, arguments)
        self.state = self._after
        return True

    def _code(self) -> bool:
        if not self.final:
            return False
        code = self.buf[self.pos:].removesuffix("<|eom_id|>")
        self.whole_call("python", json.dumps({"code": code}, ensure_ascii=False))
        self.pos = len(self.buf)
        return self.done_body()

    def _after(self) -> bool:
        """After a call: ``;`` and another call, or the rest is content."""
        i = self.pos
        while i < len(self.buf) and self.buf[i].isspace():
            i += 1
        if i == len(self.buf) and not self.final:
            return False
        if i < len(self.buf) and self.buf[i] == ";":
            self.pos = i + 1
            self.guess()
            self.mark, self.state = i, self._lead  # the ";" is content if no call follows
            return True
        return self.done_body()


def new_parser(tools: tuple[Any, ...] = ()) -> Llama3Parser:
    return Llama3Parser(tools)
