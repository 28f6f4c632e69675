"""The acme-xml parser: ``<acme_call>{"name": ..., "arguments": {...}}</acme_call>``.

Text outside the tags is content; each tagged JSON object is one call. The parser streams:
content as soon as it cannot be the start of ``<acme_call>``, the call's start once its name
is known, and its arguments as they are generated. A stream is cut wherever tokens end, so
every decision waits until the text seen so far settles it, and the events are the same
however the text is cut.
"""

from __future__ import annotations

import json
import re

from mlxcel.toolcalls.api import ParseEvent

OPEN, CLOSE = "<acme_call>", "</acme_call>"
# A call's head, up to the "{" that opens its arguments: the name streams from there on.
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*\{')


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


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


class AcmeParser:
    """One per request. States: outside a call, in its head (name not yet known), in its
    arguments (``depth`` open brackets, maybe inside a JSON string), or after them."""

    def __init__(self, tools: list[dict]) -> None:
        self.tools = tools
        self.buf = ""  # text seen but not yet turned into events
        self.state = "outside"  # outside | head | arguments | tail
        self.index = 0  # the current (or next) call's index
        self.depth, self.in_string, self.escaped = 0, False, False

    def feed(self, text: str) -> list[ParseEvent]:
        self.buf += text
        events: list[ParseEvent] = []
        while getattr(self, f"_{self.state}")(events):
            pass
        return events

    def finish(self) -> list[ParseEvent]:
        """The end of the output: held-back text is content, an unclosed call is ended."""
        events = self.feed("")
        if self.state == "outside" and self.buf:
            events.append(ParseEvent(kind="content", text=self.buf))
        elif self.state == "head":  # a call cut off before its arguments began
            events += self._whole(self.buf) or [ParseEvent(kind="content", text=OPEN + self.buf)]
        elif self.state in ("arguments", "tail"):
            events.append(ParseEvent(kind="call_end", index=self.index))
        self.buf, self.state = "", "outside"
        return events

    # Each step turns what it can of ``buf`` into events; True: call the next state's step.

    def _outside(self, events: list[ParseEvent]) -> bool:
        at = self.buf.find(OPEN)
        cut = len(self.buf) - held_back(self.buf, OPEN) if at < 0 else at
        if cut:
            events.append(ParseEvent(kind="content", text=self.buf[:cut]))
        if at < 0:
            self.buf = self.buf[cut:]
            return False
        self.buf, self.state = self.buf[at + len(OPEN):], "head"
        return True

    def _head(self, events: list[ParseEvent]) -> bool:
        head = HEAD.match(self.buf)
        if head:
            name = json.loads(head.group(1))
            events.append(ParseEvent(kind="call_start", index=self.index, name=name))
            self.buf, self.state = "{" + self.buf[head.end():], "arguments"
            self.depth, self.in_string, self.escaped = 0, False, False
            return True
        at = close_outside_strings(self.buf)
        if at < 0:
            return False  # not settled yet: wait for more text
        # Not the streamed shape (say, "arguments" before "name"): parse the call whole.
        body, self.buf, self.state = self.buf[:at], self.buf[at + len(CLOSE):], "outside"
        events += self._whole(body) or [ParseEvent(kind="content", text=OPEN + body + CLOSE)]
        return True

    def _arguments(self, events: list[ParseEvent]) -> bool:
        end = self._scan()
        if end:
            events.append(ParseEvent(kind="call_arguments", index=self.index,
                                     text=self.buf[:end]))
            self.buf = self.buf[end:]
        if self.depth:
            return False
        self.state = "tail"
        return True

    def _tail(self, events: list[ParseEvent]) -> bool:
        at = self.buf.find(CLOSE)  # what is left of the object is its closing "}"
        if at < 0:
            return False
        events.append(ParseEvent(kind="call_end", index=self.index))
        self.buf, self.state, self.index = self.buf[at + len(CLOSE):], "outside", self.index + 1
        return True

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

    def _whole(self, body: str) -> list[ParseEvent]:
        """A call written in any key order, parsed once it is complete; [] if it is not."""
        try:
            call = json.loads(body)
            name, arguments = call["name"], call["arguments"]
        except (ValueError, TypeError, KeyError):
            return []
        events = [ParseEvent(kind="call_start", index=self.index, name=name),
                  ParseEvent(kind="call_arguments", index=self.index,
                             text=json.dumps(arguments, ensure_ascii=False)),
                  ParseEvent(kind="call_end", index=self.index)]
        self.index += 1
        return events


def new_parser(tools: list[dict]) -> AcmeParser:
    """What ``ToolFormat.parser`` names: a fresh parser for one request's ``tools``."""
    return AcmeParser(tools)
