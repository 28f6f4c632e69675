"""The {{tool_format}} parser: ``<{{tool_format}}>{"name": ..., "arguments": {...}}</{{tool_format}}>``.

A starting point that is right but does not stream: it keeps the whole output and parses
it in ``finish()``, so its events cannot depend on how the stream was cut. Make it stream
(content as soon as it cannot start a tag, a call's start once its name is known, argument
fragments while generated) as ``docs/tutorial/first-tool-format.md`` shows.
"""

from __future__ import annotations

import json

from mlxcel.toolcalls.api import ParseEvent

OPEN, CLOSE = "<{{tool_format}}>", "</{{tool_format}}>"


class Parser:
    """One per request: all its state lives here."""

    def __init__(self, tools: list[dict]) -> None:
        self.tools = tools
        self.text = ""

    def feed(self, text: str) -> list[ParseEvent]:
        self.text += text
        return []

    def finish(self) -> list[ParseEvent]:
        events, rest, index = [], self.text, 0
        while OPEN in rest:
            head, _, rest = rest.partition(OPEN)
            body, closed, after = rest.partition(CLOSE)
            try:
                call = json.loads(body)
                name, arguments = call["name"], json.dumps(call["arguments"])
            except (ValueError, TypeError, KeyError):  # not a call: the text stays visible
                events.append(ParseEvent(kind="content", text=head + OPEN + body + closed))
                rest = after
                continue
            events += [ParseEvent(kind="content", text=head),
                       ParseEvent(kind="call_start", index=index, name=name),
                       ParseEvent(kind="call_arguments", index=index, text=arguments),
                       ParseEvent(kind="call_end", index=index)]
            rest, index = after, index + 1
        return events + [ParseEvent(kind="content", text=rest)]


def new_parser(tools: list[dict]) -> Parser:
    """What ``ToolFormat.parser`` names: a fresh parser for one request's ``tools``."""
    return Parser(tools)
