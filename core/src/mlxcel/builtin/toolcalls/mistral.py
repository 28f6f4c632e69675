"""Mistral, both forms after the ``[TOOL_CALLS]`` token.

* Nemo (and Small 3.1's template): ``[TOOL_CALLS][{"name": ..., "arguments": {...},
  "id": "..."}, ...]``, a JSON list (one object also counts);
* bracketed (v11+ tokenizers: Ministral, Small 3.2, Magistral, Devstral):
  ``[TOOL_CALLS]NAME[CALL_ID]id[ARGS]{json}``, repeated per call, ``[CALL_ID]`` optional.

One parser reads both, told apart by the first character after the token, since a model
of either template may write either; the two formats differ in what selects them and in
their forced-call grammar. ``[TOOL_CALLS]`` is a special token, so what follows it is a
call or a ``CallError``, never prose. Names and arguments stream. A list's ``"id"`` comes
after the name in Mistral's template, so it reaches ``ParsedCall.id`` (a streamed call
keeps the id the server gave it); ``[CALL_ID]`` comes first and reaches ``CallStart``.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser

OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralParser(StreamParser):
    id_keys = ("id",)
    openers = (OPEN,)

    def opens(self, marker: str) -> Any:
        return self._head

    def _head(self) -> bool:
        read = self.json_calls(then=self.done_body)
        if read is None:
            self.state = self._name
            return True
        return read

    def _name(self) -> bool:
        if isinstance(name := self.name_before("["), str):
            self._call, self._call_id = name, None
        return self.go(name, f"{OPEN} is followed by neither JSON nor NAME{ARGS}", self._marker)

    def _marker(self) -> bool:
        if self._call_id is None and (found := self.match(CALL_ID)) is not False:
            if found:
                self.state = self._id
            return found or self.wait()
        found = self.match(ARGS)
        if found is None:
            return self.wait()
        if not found:
            return self.broken(f"a bracketed call's name is not followed by {ARGS}")
        self.start_call(self._call, self._call_id or None)
        self.state = self._args
        return True

    def _id(self) -> bool:
        j = self.buf.find("[", self.pos)
        if j < 0:
            return self.wait()
        self._call_id, self.pos, self.state = self.buf[self.pos:j].strip(), j, self._marker
        return True

    def _args(self) -> bool:
        return self.arguments(self.done_body, f"{ARGS} is not followed by a JSON object")


def new_parser(tools: tuple[Any, ...] = ()) -> MistralParser:
    return MistralParser(tools)
