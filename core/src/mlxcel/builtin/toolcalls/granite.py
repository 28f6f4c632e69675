"""IBM Granite: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]``.

That is what Granite 3.0-3.3 templates ask for ("respond only with <|tool_call|> followed
by a JSON list of tools used"). Granite 3.3's thinking mode wraps the answer text in
``<response>...</response>`` after its ``<think>`` block, and those tags are markup, which
also covers the spec's ``<response><tool_call>...</tool_call></response>`` reading.
``<tool_call>`` opens calls too, with an optional ``</tool_call>``: Granite 3.1 wrote it as
text, and Granite 4.0 templates write Hermes-style blocks. A list or a single object
follows; calls stream."""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import StreamParser

OPENERS, CLOSE = ("<|tool_call|>", "<tool_call>"), "</tool_call>"
DROPPED = ("<response>", "</response>")


class GraniteParser(StreamParser):
    resync = (CLOSE,)
    openers = OPENERS
    dropped = DROPPED
    closer = CLOSE

    def opens(self, marker: str) -> Any:
        return self._body

    def _body(self) -> bool:
        read = self.json_calls(then=self.close_body)
        if read is None:
            return self.broken("<|tool_call|> is not followed by a JSON list of calls")
        return read


def new_parser(tools: tuple[Any, ...] = ()) -> GraniteParser:
    return GraniteParser(tools)
