"""The {{tool_format}} parser: ``<{{tool_format}}>{"name": ..., "arguments": {...}}</{{tool_format}}>``.

A starting point that is right but does not stream: it keeps the whole answer and parses
it in ``finish()``, so its events cannot depend on how the stream was cut. Make it stream
(text as soon as it cannot start a tag, a call's start once its name is known, argument
fragments while generated) as ``docs/tutorial/first-tool-format.md`` shows.
"""

from __future__ import annotations

import json

from mlxcel.types.toolcalls import (
    CallArguments,
    CallEnd,
    CallError,
    CallStart,
    ParsedCall,
    ParseResult,
    ToolEvent,
    ToolText,
)

OPEN, CLOSE = "<{{tool_format}}>", "</{{tool_format}}>"


class Parser:
    """One per answer: all its state lives here."""

    def __init__(self, tools: tuple) -> None:
        self.tools = tools
        self.text = ""

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ToolEvent]:
        self.text += text
        return []

    def finish(self) -> ParseResult:
        events: list[ToolEvent] = []
        calls: list[ParsedCall] = []
        rest = self.text
        while OPEN in rest:
            head, _, rest = rest.partition(OPEN)
            body, closed, rest = rest.partition(CLOSE)
            events.append(ToolText(text=head))
            call = _call(body)
            if call is None:  # not a call: say so, and keep its text
                events.append(CallError(message="not a JSON call", text=OPEN + body + closed))
                continue
            index = len(calls)
            calls.append(call)
            events += [CallStart(index=index, name=call.name),
                       CallArguments(index=index, text=call.arguments), CallEnd(index=index)]
        events.append(ToolText(text=rest))
        return ParseResult(events=tuple(events), calls=tuple(calls))


def _call(body: str) -> ParsedCall | None:
    """``{"name": ..., "arguments": {...}}`` as a call, or None."""
    try:
        call = json.loads(body)
        name, arguments = call["name"], call["arguments"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return ParsedCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def new_parser(tools: tuple) -> Parser:
    """What ``ToolFormat.parser`` names: a fresh parser for one answer, given the request's
    function tools (``mlxcel.types.messages.Tool``)."""
    return Parser(tools)
