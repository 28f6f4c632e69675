"""Functionary v3.2: ``>>>RECIPIENT\\n`` headers; ``all`` is text to the user, ``python`` is
code, any other recipient is a function whose JSON arguments follow.

The template's generation prompt ends with ``>>>``, so the answer opens with a bare
recipient line; later ones repeat ``>>>``. ``>>>`` is plain text (a Python prompt in an
answer writes it too), so a header is tentative until ``NAME\\n{`` settles it: anything
else stays content, header included. Calls start at their ``{`` and their arguments
stream; ``python`` code runs to the next header or the end and becomes call ``python``
with ``{"code": ...}``, sent whole.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.toolcalls.kit import StreamParser

HEADER = ">>>"


class FunctionaryV32Parser(StreamParser):
    openers = (HEADER,)

    plain = (HEADER,)

    def start(self) -> bool:
        found = self.match(HEADER)
        if found is None:
            return self.wait()
        self.guess(self._recipient)
        if found:  # the answer wrote the first ">>>" itself
            self.opened(len(HEADER), tentative=True)
        return True

    def opens(self, marker: str) -> Any:
        return self._recipient

    def _recipient(self) -> bool:
        name = self.name_before("\n", limit=64)
        if name is None:
            return self.wait()
        if name is False or not name.isidentifier():
            return self.abort()
        self.pos += 1
        if name == "all":  # text follows: the header is markup
            self.mark, self.tentative = -1, False
            self.state = self.content
        elif name == "python":
            self.tentative, self.state = False, self._code
        else:
            self._call, self.state = name, self._args
        return True

    def _args(self) -> bool:
        """Tentative until its ``{`` starts the call: anything else is content."""
        return self.arguments(self.done_body, "no JSON object", call=self._call)

    def _code(self) -> bool:
        j = self.buf.find(HEADER, self.pos)
        if j < 0 and not self.final:
            return False
        end = len(self.buf) if j < 0 else j
        self.whole_call("python", json.dumps({"code": self.buf[self.pos:end].rstrip("\n")},
                                             ensure_ascii=False))
        self.pos = end
        return self.done_body()


def new_parser(tools: tuple[Any, ...] = ()) -> FunctionaryV32Parser:
    return FunctionaryV32Parser(tools)
