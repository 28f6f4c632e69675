"""Generic JSON: the whole answer is one call, ``{"name": ..., "arguments": {...}}``, or a
list of them.

The fallback for templates that ask for bare JSON calls. Nothing marks a call, so the
JSON is tentative until its first key and name say it is one (a name the request does not
declare, when it declares any, is content); after the first call of a list, the rest of
the list is calls. Calls stream as the other JSON formats' do; text after the JSON is
content.
"""

from __future__ import annotations

from typing import Any

from mlxcel.builtin.toolcalls.json_stream import StreamParser


class GenericJsonParser(StreamParser):
    def start(self) -> bool:
        return self.guess(self._lead)

    def _lead(self) -> bool:
        read = self.json_calls(then=self.done_body, tentative=True)
        return self.abort() if read is None else read


def new_parser(tools: tuple[Any, ...] = ()) -> GenericJsonParser:
    return GenericJsonParser(tools)
