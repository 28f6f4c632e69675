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

import re
from typing import Any

from mlxcel.builtin.toolcalls.py_calls import PythonCallParser, builtin_call
from mlxcel.toolcalls.kit import next_char

TAG = "<|python_tag|>"
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\(")
_BUILTIN_PREFIX = re.compile(r"[A-Za-z_]\w*(\.(c(a(l(l\(?)?)?)?)?)?")


class Llama3Parser(PythonCallParser):
    openers = (TAG,)

    def start(self) -> bool:
        return self.guess(self._lead)

    def _lead(self) -> bool:
        """The answer's start, or what follows a ``;``: a call (an object, or the JSON list
        of calls some Llama-based templates ask for), or else content."""
        if self.peek() is None and self.final and self.buf.startswith(";", self.mark):
            self.mark, self.tentative = -1, False  # a trailing separator is markup
        read = self.json_calls(then=self._after, tentative=True)
        if read is not None:
            return read
        found = self.match(TAG) if self.buf[self.pos] == "<" else False
        if found is None:
            return self.wait()
        if found:
            self.opened(len(TAG))
            self.state = self.opens(TAG)
            return True
        return self.abort()

    def opens(self, marker: str) -> Any:
        return self._tagged

    @next_char
    def _tagged(self, c: str) -> bool:
        if c == "{":
            return self.objects(then=self._after)
        head = self.python_head(_BUILTIN, _BUILTIN_PREFIX)
        if head is None:
            return False
        if head:
            start, self.pos = self.pos, head.end() - 1
            return self.read_python(start, builtin_call, self._builtin)
        self.state = self.python_code
        return True

    def _builtin(self, call: tuple[str, str]) -> bool:
        self.whole_call(*call)
        self.state = self._after
        return True

    def _after(self) -> bool:
        """After a call: ``;`` and another call, or the rest is content."""
        i = self.pos
        while i < len(self.buf) and self.buf[i].isspace():
            i += 1
        if i == len(self.buf) and not self.final:
            return False
        if i < len(self.buf) and self.buf[i] == ";":
            self.pos = i + 1
            self.guess(self._lead)
            self.mark = i  # the ";" is content if no call follows
            return True
        return self.done_body()


def new_parser(tools: tuple[Any, ...] = ()) -> Llama3Parser:
    return Llama3Parser(tools)
