"""Cohere Command R7B, and Command R / R+ before it: a JSON list of
``{"tool_call_id": ..., "tool_name": ..., "parameters": {...}}``.

* R7B writes it between ``<|START_ACTION|>`` and ``<|END_ACTION|>`` (special tokens), its
  answer text between ``<|START_RESPONSE|>`` and ``<|END_RESPONSE|>``, which are markup;
* R / R+ write ``Action: ```json\\n[...]\\n``` `` in plain text, so that one is tentative
  until its first call's name settles it (``Action: `` in prose stays content).

``tool_call_id`` is the call's ordinal in the turn (``"0"``, ``"1"``...), which R7B's
template maps back by position, not an id to echo, so the server gives each call its own.
The spec's "Action Input:" appears in no Cohere template, so nothing reads it. Plans
between ``<|START_THINKING|>`` and ``<|END_THINKING|>`` are reasoning, the family's split.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser, next_char

ACTION, END, PLAIN, FENCE = "<|START_ACTION|>", "<|END_ACTION|>", "Action:", "```"
RESPONSE = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")


class CommandRParser(StreamParser):
    name_keys = ("tool_name", "name")
    args_keys = ("parameters", "arguments")
    resync = (END,)
    openers = (ACTION,)
    plain = (PLAIN,)
    dropped = RESPONSE

    def opens(self, marker: str) -> Any:
        self.closer = END if marker == ACTION else ""
        return self._body if marker == ACTION else self._fence

    @next_char
    def _fence(self, c: str) -> bool:
        if c == "`":
            found = self.match(FENCE + "json")
            found = found if found is not False else self.match(FENCE)
            if found is None:
                return self.wait()
            if not found:
                return self.abort()
            self.closer = FENCE
        self.state = self._body
        return True

    def _body(self) -> bool:
        read = self.json_calls(then=self.close_body, tentative=self.tentative)
        return self.broken(f"{ACTION} is not followed by a JSON list of calls") \
            if read is None else read


def new_parser(tools: tuple[Any, ...] = ()) -> CommandRParser:
    return CommandRParser(tools)
