"""Functionary v3.1 (Llama 3.1 based): ``<function=NAME>{json}</function>``, and
``<|python_tag|>`` code for its code interpreter.

The name is whole at ``>``, so the call starts there and its JSON arguments stream. Code
after ``<|python_tag|>`` runs to the end of the answer and becomes call ``python`` with
``{"code": ...}`` (llama.cpp's reading), sent at the end. A ``<function=`` that is not
followed by a name, ``>`` and a JSON object is a ``CallError`` up to its ``</function>``.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser

OPEN, CLOSE, TAG = "<function=", "</function>", "<|python_tag|>"


class FunctionaryV31Parser(StreamParser):
    resync = (CLOSE,)
    openers = (OPEN, TAG)
    closer = CLOSE

    def opens(self, marker: str) -> Any:
        return self._name if marker == OPEN else self.python_code

    def _name(self) -> bool:
        name = self.name_before(">")
        if isinstance(name, str):
            self.pos += 1  # past the ">"
        return self.begin_call(name, f"{OPEN} is not followed by a name and '>'", self._args)

    def _args(self) -> bool:
        return self.arguments(self.close_body, f"{OPEN}...> is not followed by a JSON object")


def new_parser(tools: tuple[Any, ...] = ()) -> FunctionaryV31Parser:
    return FunctionaryV31Parser(tools)
