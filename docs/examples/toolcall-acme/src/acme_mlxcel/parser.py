"""The acme-xml parser: ``<acme_call>{"name": ..., "arguments": {...}}</acme_call>``.

Text outside the tags is answer text; each tagged JSON object is one call. The parser
streams: text as soon as it cannot be the start of ``<acme_call>``, the call's start once
its name is known, and its arguments as they are generated. A stream is cut wherever tokens
end, so every decision waits until the text seen so far settles it, and the events are the
same however the text is cut. ``finish()`` reports every call it read, with the arguments
exactly as streamed, so what a client saw streamed and the final calls always agree.
"""

from __future__ import annotations

import json
import re

from mlxcel.toolcalls.kit import (
    CallArguments,
    CallEnd,
    CallError,
    CallStart,
    Decoded,
    ParsedCall,
    ParseResult,
    TextStates,
    ToolEvent,
    ToolText,
)

OPEN, CLOSE = "<acme_call>", "</acme_call>"
# A call's head, up to the "{" that opens its arguments: the name streams from there on.
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*\{')


def close_outside_strings(text: str) -> int:
    """Where ``CLOSE`` first appears in ``text`` outside a JSON string, or -1: a string in
    the call may contain the tag, and the call does not end there."""
    in_string = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif text.startswith(CLOSE, i):
            return i
    return -1


class AcmeParser(TextStates):
    """One per answer. States (``TextStates``: ``feed`` runs ``_<state>`` over the held
    ``buf``): outside a call, in its head (name not yet known), in its arguments
    (``depth`` open brackets, maybe inside a JSON string), or after them. ``calls``: the
    calls read so far; the next one's index."""

    def __init__(self, tools: tuple) -> None:
        super().__init__("outside")  # outside | head | arguments | tail
        self.tools = tools
        self.name, self.arguments = "", ""  # the call being read
        self.depth, self.in_string, self.escaped = 0, False, False

    def finish(self) -> ParseResult:
        """The end of the answer: held-back text is answer text, a call whose arguments
        are complete is ended, a call cut off before that is an error; then every call."""
        events = self.feed("")
        if self.state == "outside" and self.buf:
            events.append(ToolText(text=self.buf))
        elif self.state == "head":  # cut off before its arguments began: parse it whole
            events += self._whole(self.buf) or [CallError(message="an unclosed call",
                                                          text=OPEN + self.buf)]
        elif self.state == "tail":
            events += self._end()
        elif self.state == "arguments":  # its start and fragments went out: end it there
            events += [CallEnd(index=len(self.calls)),
                       CallError(message="the answer ended inside a call's arguments")]
        self.buf, self.state = "", "outside"
        return ParseResult(events=tuple(events), calls=tuple(self.calls))

    # Each step turns what it can of ``buf`` into events; True: call the next state's step.

    def _outside(self, events: list[ToolEvent]) -> bool:
        if not self.text_until(events, (OPEN,)):
            return False  # a partial <acme_call> stays held
        self.state = "head"
        return True

    def _head(self, events: list[ToolEvent]) -> bool:
        head = HEAD.match(self.buf)
        if head:
            self.name, self.arguments = json.loads(head.group(1)), ""
            events.append(CallStart(index=len(self.calls), name=self.name))
            self.buf, self.state = "{" + self.buf[head.end():], "arguments"
            self.depth, self.in_string, self.escaped = 0, False, False
            return True
        at = close_outside_strings(self.buf)
        if at < 0:
            return False  # not settled yet: wait for more text
        # Not the streamed shape (say, "arguments" before "name"): parse the call whole.
        body, self.buf, self.state = self.buf[:at], self.buf[at + len(CLOSE):], "outside"
        events += self._whole(body) or [CallError(message="not a JSON call",
                                                  text=OPEN + body + CLOSE)]
        return True

    def _arguments(self, events: list[ToolEvent]) -> bool:
        end = self._scan()
        if end:
            fragment, self.buf = self.buf[:end], self.buf[end:]
            self.arguments += fragment
            events.append(CallArguments(index=len(self.calls), text=fragment))
        if self.depth:
            return False
        self.state = "tail"
        return True

    def _tail(self, events: list[ToolEvent]) -> bool:
        at = self.buf.find(CLOSE)  # what is left of the object is its closing "}"
        if at < 0:
            return False
        events += self._end()
        self.buf, self.state = self.buf[at + len(CLOSE):], "outside"
        return True

    def _end(self) -> list[ToolEvent]:
        """The call being read is complete: it ends, and counts among the calls."""
        self.calls.append(ParsedCall(name=self.name, arguments=self.arguments))
        return [CallEnd(index=len(self.calls) - 1)]

    def _scan(self) -> int:
        """Walk ``buf`` through the arguments' JSON; the length that belongs to them."""
        for i, ch in enumerate(self.buf):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if not self.depth:
                    return i + 1
        return len(self.buf)

    def _whole(self, body: str) -> list[ToolEvent]:
        """A call written in any key order, parsed once it is complete; [] if it is not."""
        try:
            call = json.loads(body)
            name, arguments = call["name"], call["arguments"]
        except (ValueError, TypeError, KeyError):
            return []
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return []
        events: list[ToolEvent] = []
        self.send(events, Decoded(name, json.dumps(arguments, ensure_ascii=False)))
        return events


def new_parser(tools: tuple) -> AcmeParser:
    """What ``ToolFormat.parser`` names: a fresh parser for one answer, given the request's
    function tools (``mlxcel.types.messages.Tool``; acme's calls do not need them)."""
    return AcmeParser(tools)
