"""Functionary v3.1 (Llama 3.1 based): ``<function=NAME>{json}</function>``, and
``<|python_tag|>`` code for its code interpreter.

The name is whole at ``>``, so the call starts there and its JSON arguments stream. Code
after ``<|python_tag|>`` runs to the end of the answer and becomes call ``python`` with
``{"code": ...}`` (llama.cpp's reading), sent at the end. A ``<function=`` that is not
followed by a name, ``>`` and a JSON object is a ``CallError`` up to its ``</function>``.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.builtin.toolcalls.json_stream import DONE, MORE, StreamParser

OPEN, CLOSE, TAG = "<function=", "</function>", "<|python_tag|>"


class FunctionaryV31Parser(StreamParser):
    resync = (CLOSE,)
    openers = (OPEN, TAG)

    def content(self) -> bool:
        found = self.scan(self.openers)
        if found is None:
            return False
        self.opened(len(found))
        self.state = self._name if found == OPEN else self._code
        return True

    def _name(self) -> bool:
        name = self.name_before(">")
        if name is None:
            return False
        if name is False:
            return self.broken(f"{OPEN} is not followed by a name and '>'")
        self.pos += 1
        self.start_call(name)
        self.state = self._args
        return True

    def _args(self) -> bool:
        if self.value is None:
            c = self.peek()
            if c is None:
                return self.wait()
            if c != "{":
                return self.broken(f"{OPEN}...> is not followed by a JSON object")
            self.begin_value()
        r = self.pump_value()
        if r == MORE:
            return False
        if r != DONE:
            return self.broken(self.why)
        self.state = self._close
        return True

    def _close(self) -> bool:
        if self.match(CLOSE, skip_space=True) is None:
            return self.wait()
        return self.done_body()

    def _code(self) -> bool:
        if not self.final:
            return False
        code = self.buf[self.pos:].removesuffix("<|eom_id|>")
        self.whole_call("python", json.dumps({"code": code}, ensure_ascii=False))
        self.pos = len(self.buf)
        return self.done_body()


def new_parser(tools: tuple[Any, ...] = ()) -> FunctionaryV31Parser:
    return FunctionaryV31Parser(tools)
