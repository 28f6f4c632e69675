"""Hermes / Qwen / DeepSeek: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

One block per call is what the templates write, but a block holding several objects (or a
JSON list of them) is read as several calls, where mlx-lm's ``json_tools`` does one bare
``json.loads`` of the block and fails. The name streams as soon as its string is whole and
the arguments as the model writes them, verbatim. A block whose content is not call JSON
is a ``CallError`` carrying the block, so nothing of the answer is lost; a block the answer
ends in after whole calls, with no ``</tool_call>``, keeps its calls.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(StreamParser):
    resync = (CLOSE,)
    openers = (OPEN,)

    def opens(self, marker: str) -> Any:
        self._base = len(self._calls)
        return self._block

    def _block(self) -> bool:
        whole = len(self._calls) > self._base
        if self.final and whole and self.peek() is None:
            self.mark = -1  # no </tool_call> before the end: the calls stand
            return False
        read = self.json_calls(then=self._next)
        if read is not None:
            return read
        closed = self.match(CLOSE)
        if closed is None:
            return self.wait()
        if closed and whole:
            return self.done_body()
        if closed:
            self.fail("an empty <tool_call> block", self.buf[self.mark:self.pos])
            return self.done_body()
        return self.broken("a <tool_call> block holds something other than call JSON")

    def _next(self) -> bool:
        """A call of the block ended; a later one's markup starts here."""
        self.mark, self.state = self.pos, self._block
        return True


def new_parser(tools: tuple[Any, ...] = ()) -> HermesParser:
    return HermesParser(tools)
