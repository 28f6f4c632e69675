"""The Gemma 4 tool-call parser: ``<|tool_call>call:NAME{...}<tool_call|>`` blocks.

Rules, each decided by the text seen so far only, so the events, merged, are the same
however the answer was cut into tokens:

- Outside a block everything is answer text, sent as soon as it cannot be the start of
  ``<|tool_call>`` (a partial marker at the end is held). Text between and after calls is
  answer text too.
- Inside a block, ``<tool_call|>`` closes it only outside a ``<|"|>`` string, so a string
  holding the markers, ``}`` or ``,`` stays in its value.
- A closed block is decoded (``decode``) and each of its calls sent whole: one
  ``CallStart``, one ``CallArguments`` (the JSON object's text), one ``CallEnd``. The
  format writes no call id. A block that does not decode is one ``CallError`` holding its
  whole text, markers included, so nothing of the answer is lost.
- At the end of the answer, an open block (a stop token may end the last call before its
  marker) is decoded as it stands; if it does not decode it is a ``CallError``.

``finish().calls`` are the calls the events announced: each block is decoded once, whole,
which is the parse of the whole answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mlxcel.toolcalls.kit import CallError, Decoded, ParseResult, TextStates, ToolEvent, ToolText

from mlxcel_family_gemma4.decode import STR, CallSyntaxError, decode_calls, string_parameters

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"


class Gemma4Parser(TextStates):
    """One per answer (the contract's ``ToolCallParser``). States: ``outside`` a block,
    in a ``block`` (``scan``: settled up to there; ``in_string``: inside ``<|"|>``)."""

    def __init__(self, tools: Iterable[Any]) -> None:
        super().__init__("outside")
        self.strings = string_parameters(tools)
        self.in_string = False

    def finish(self) -> ParseResult:
        """The held text settled (module docstring, last rule), and every call."""
        out = self.feed("")
        if self.state == "block":
            out += self._decode(self.buf, closed=False)
        elif self.buf:
            out.append(ToolText(text=self.buf))
        self.buf, self.state = "", "outside"
        return ParseResult(events=tuple(out), calls=tuple(self.calls))

    def _outside(self, out: list[ToolEvent]) -> bool:
        if not self.text_until(out, (OPEN,)):
            return False
        self.state, self.scan, self.in_string = "block", 0, False
        return True

    def _block(self, out: list[ToolEvent]) -> bool:
        end = self._close()
        if end is None:
            return False
        body, self.buf, self.state = self.buf[:end], self.buf[end + len(CLOSE):], "outside"
        out += self._decode(body, closed=True)
        return True

    def _close(self) -> int | None:
        """Where ``<tool_call|>`` closes the block (outside strings), or None: not yet."""
        buf = self.buf
        while True:
            if self.in_string:
                at = buf.find(STR, self.scan)
                if at < 0:
                    self.scan = max(self.scan, len(buf) - len(STR) + 1)
                    return None
                self.scan, self.in_string = at + len(STR), False
                continue
            quote, close = buf.find(STR, self.scan), buf.find(CLOSE, self.scan)
            if close >= 0 and (quote < 0 or close < quote):
                return close
            if quote < 0:
                self.scan = max(self.scan, len(buf) - len(CLOSE) + 1)
                return None
            self.scan, self.in_string = quote + len(STR), True

    def _decode(self, body: str, closed: bool) -> list[ToolEvent]:
        try:
            decoded = decode_calls(body, self.strings)
        except CallSyntaxError as exc:
            return [CallError(message=str(exc), text=OPEN + body + (CLOSE if closed else ""))]
        out: list[ToolEvent] = []
        for name, arguments in decoded:
            self.send(out, Decoded(name=name, arguments=arguments))
        return out


def new_parser(tools: Iterable[Any]) -> Gemma4Parser:
    """What ``ToolFormat.parser`` names: a fresh parser for one request's ``tools``."""
    return Gemma4Parser(tools)
