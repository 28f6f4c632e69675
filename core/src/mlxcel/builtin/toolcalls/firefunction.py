"""FireFunction v2: `` functools[{"name": ..., "arguments": {...}}, ...]`` after the answer's
text, one JSON list of every call (the template writes the turn's content, then
``' functools[' + calls | join(', ') + ']'``).

``functools`` is plain text (Python's module is called that too), so a list it opens is
tentative until its first call's name settles it, as llama.cpp's parser (the prefix
`` functools[``, the ``[`` kept as the list's) and its grammar read it: anything else is
content, marker included. The space before the marker is the marker's; names and
arguments stream.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser

MARKERS = (" functools[", "functools[")


class FireFunctionParser(StreamParser):
    plain = MARKERS

    def opens(self, marker: str) -> Any:
        return self._list

    def _list(self) -> bool:
        return self.items(then=self.done_body, tentative=True)


def new_parser(tools: tuple[Any, ...] = ()) -> FireFunctionParser:
    return FireFunctionParser(tools)
