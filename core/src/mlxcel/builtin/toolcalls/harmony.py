"""Harmony (gpt-oss): the answer is a run of messages, each a header and a body::

  <|channel|>analysis<|message|>REASONING<|end|>
  <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>
  <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{..}<|call|>
  <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

The generation prompt ends ``<|start|>assistant``, so the answer opens inside the first
message's header (usually with ``<|channel|>``). A header runs to ``<|message|>``; a body
to ``<|end|>``, ``<|call|>`` or ``<|return|>``, or to the end of the answer, since
``<|call|>`` and ``<|return|>`` are stop tokens whose text the answer does not carry.

Routing by header: a recipient ``functions.NAME`` (``to=``, before or after the channel,
on any channel) makes the body a call, sent whole when the body ends, its arguments the
model's JSON text verbatim (a body that is not a JSON object is a ``CallError``). A
``final`` body, and a ``commentary`` body without a recipient (a preamble the user is
meant to see), is answer text, streamed. An ``analysis`` body is reasoning: this parser
emits nothing for it; the chat layer's reasoning split is what routes it to
``reasoning_content``, so text that reaches here is never put into content.

Any other recipient is a message that is neither content nor a call, and its body is
dropped, with a debug log ``harmony_message_dropped`` (recipient and channel, never the
body): a builtin tool's (``browser.search``, ``python``, ``container.exec``: gpt-oss calls
them on the analysis or commentary channel, and the request cannot offer them as
functions) or ``assistant`` (a tool's reply the model wrote itself, or a garbled header
such as ``<|channel|>commentary to=assistant<|channel|>analysis``). Upstream agrees that
such text is never content: vLLM builds calls only from ``functions.*`` recipients and
content only from ``final`` and recipient-less ``commentary`` messages (openai-harmony's
parse; analysis-channel ones become reasoning there), and llama.cpp's gpt-oss parser skips
a header it does not know with a debug log. It is dropped rather than made reasoning
because a tool parser has no reasoning event, and the chat layer's split hands every
addressed header to the tool parser.

Text that cannot be a header (a newline, an end marker, or more than ``HEADER_LIMIT``
characters before ``<|message|>``) is answer text, for a model that does not follow the
format. mlx-lm has no harmony decoder.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from mlxcel.builtin.toolcalls.markup_values import call_name, json_object_text
from mlxcel.toolcalls.kit import Decoded, MarkupError, TextStates, first_of, partial_suffix
from mlxcel.types.toolcalls import CallError, ParseResult, ToolEvent, ToolText

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADER_LIMIT = 256
_NOT_HEADER = ("\n", *ENDS)
_LONGEST = max(map(len, (MESSAGE, START, *_NOT_HEADER)))
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]*)")
_ROLE = re.compile(r"\s*[A-Za-z_]*\s*")
FUNCTIONS = "functions"
log = structlog.get_logger("mlxcel.toolcalls")


class HarmonyParser(TextStates):
    """One answer's parser. States: ``header`` (before ``<|message|>``), ``body`` (of a
    message routed as ``text``, ``hidden`` or ``call``), ``plain`` (text that is no
    message, until one starts)."""

    def __init__(self) -> None:
        super().__init__("header")
        self._kind, self._recipient = "", ""
        self._role_next = False  # the header follows <|start|>, so it opens with a role

    def finish(self) -> ParseResult:
        """The open message ends with the answer: a call's body is decoded, answer text
        flushed; an unfinished header is dropped unless it is plain text."""
        events: list[ToolEvent] = []
        buf, self.buf = self.buf, ""
        if self.state == "plain" or (self.state == "body" and self._kind == "text"):
            events += [ToolText(text=buf)] if buf else []
        elif self.state == "body" and self._kind == "call":
            self._call(events, buf)
        elif self.state == "header" and self._stray(buf):
            events.append(ToolText(text=buf))
        self.state = "header"
        return ParseResult(events=tuple(events), calls=tuple(self.calls))

    def _header(self, events: list[ToolEvent]) -> bool:
        at, marker = first_of(self.buf, (MESSAGE, START, *_NOT_HEADER), self.scan)
        if at < 0 or at > HEADER_LIMIT:
            self.scan = max(0, len(self.buf) - _LONGEST + 1)
            if len(self.buf) < HEADER_LIMIT + _LONGEST:
                return False  # a marker within the limit may still complete
            return self._give_up(events, HEADER_LIMIT)
        self.scan = 0
        if marker in _NOT_HEADER:
            return self._give_up(events, at + len(marker))
        head, self.buf = self.buf[:at], self.buf[at + len(marker):]
        if self._stray(head):  # words, not a header: answer text
            events.append(ToolText(text=head))
        if marker == START:  # a new message begins; what came before was no header
            self._role_next = True
        else:
            self._open(head)
        return True

    def _stray(self, head: str) -> bool:
        """Whether text where a header belongs is answer text: not blank, no header
        marker in it, and not the role word that follows ``<|start|>``."""
        return bool(head.strip()) and not _header_like(head) \
            and not (self._role_next and _ROLE.fullmatch(head))

    def _give_up(self, events: list[ToolEvent], cut: int) -> bool:
        """The first ``cut`` characters are no header: answer text."""
        events.append(ToolText(text=self.buf[:cut]))
        self.buf, self.state, self.scan = self.buf[cut:], "plain", 0
        self._role_next = False
        return True

    def _plain(self, events: list[ToolEvent]) -> bool:
        at, marker = first_of(self.buf, (START, CHANNEL))
        cut = len(self.buf) - partial_suffix(self.buf, (START, CHANNEL)) if at < 0 else at
        if cut:
            events.append(ToolText(text=self.buf[:cut]))
        if at < 0:
            self.buf = self.buf[cut:]
            return False
        skip = len(START) if marker == START else 0  # a channel marker is the header's
        self.buf, self.state, self._role_next = self.buf[at + skip:], "header", bool(skip)
        return True

    def _open(self, header: str) -> None:
        """Route the message whose header this is."""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        self._recipient = recipient.group(1) if recipient else ""
        namespace = self._recipient.partition(".")[0]
        if namespace == FUNCTIONS:
            self._kind = "call"
        elif self._recipient:
            log.debug("harmony_message_dropped", recipient=self._recipient,
                      channel=channel.group(1) if channel else None)
            self._kind = "hidden"
        elif channel and channel.group(1) == "analysis":
            self._kind = "hidden"
        else:
            self._kind = "text"
        self.state = "body"

    def _body(self, events: list[ToolEvent]) -> bool:
        at, marker = first_of(self.buf, ENDS, self.scan)
        if self._kind == "call":
            if at < 0:
                self.scan = max(0, len(self.buf) - _LONGEST + 1)
                return False
            body, self.buf, self.scan = self.buf[:at], self.buf[at + len(marker):], 0
            self._call(events, body)
            self.state, self._role_next = "header", False
            return True
        cut = len(self.buf) - partial_suffix(self.buf, ENDS) if at < 0 else at
        if cut and self._kind == "text":
            events.append(ToolText(text=self.buf[:cut]))
        if at < 0:
            self.buf = self.buf[cut:]
            return False
        self.buf, self.state = self.buf[at + len(marker):], "header"
        self._role_next = False
        return True

    def _call(self, events: list[ToolEvent], body: str) -> None:
        """A call's body: its events, or a ``CallError`` holding the body."""
        try:
            function = self._recipient.partition(".")[2]
            if not function:
                raise MarkupError(f"a message to {self._recipient!r} names no function")
            call = Decoded(call_name(function), json_object_text(body))
        except MarkupError as exc:
            events.append(CallError(message=str(exc), text=body))
            return
        self.send(events, call)


def _header_like(text: str) -> bool:
    """Whether unfinished text is a message header (markup), not words of an answer."""
    return CHANNEL in text or CONSTRAIN in text or _RECIPIENT.search(text) is not None


def new_parser(tools: tuple[Any, ...]) -> HarmonyParser:
    """A parser for one harmony answer (the JSON arguments need no schema)."""
    return HarmonyParser()
