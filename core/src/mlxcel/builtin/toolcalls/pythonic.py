"""Pythonic calls: ``[get_weather(city="Paris", days=2), ...]``, as Llama 3.2/4's pythonic
templates ask for, optionally between ``<|tool_call_start|>`` and ``<|tool_call_end|>``
(LFM2, some Nemotron templates).

The list is parsed with Python's ``ast`` once its ``]`` arrives (literals only), and its
calls are sent whole: a Python call is not JSON, so there is no text to stream verbatim.
Without the markers, a list at the answer's start is a call only if it begins
``[NAME(`` and parses; anything else is content. Between the markers it is a call or a
``CallError``.
"""

from __future__ import annotations

import re
from typing import Any

from mlxcel.builtin.toolcalls.py_calls import PythonCallParser, call_list
from mlxcel.toolcalls.kit import next_char

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_HEAD = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_HEAD_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")


class PythonicParser(PythonCallParser):
    resync = (END,)
    openers = (START,)
    closer = END

    def start(self) -> bool:
        return self.guess(self._lead)

    @next_char
    def _lead(self, c: str) -> bool:
        head = self.python_head(_HEAD, _HEAD_PREFIX)
        if head is None:
            return False
        return self._list() if head else self.abort()

    def opens(self, marker: str) -> Any:
        return self._open

    @next_char
    def _open(self, c: str) -> bool:
        return self._list() if c == "[" else self.broken(f"{START} is not followed by [")

    def _list(self) -> bool:
        return self.read_python(self.pos, call_list, self._send_calls)

    def _send_calls(self, calls: list[tuple[str, str]]) -> bool:
        if self.tentative and self.tool_names and \
                any(name not in self.tool_names for name, _ in calls):
            return self.abort()
        for name, arguments in calls:
            self.whole_call(name, arguments)
        self.state = self.close_body
        return True


def new_parser(tools: tuple[Any, ...] = ()) -> PythonicParser:
    return PythonicParser(tools)
