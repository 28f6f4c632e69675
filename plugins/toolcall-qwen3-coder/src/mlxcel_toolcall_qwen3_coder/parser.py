"""The Qwen3-Coder parser: XML calls, streamed while the model writes them.

    text before the call
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Rules, each decided only once the text seen so far settles it, so the events are the
same however the stream is cut:

- Outside ``<tool_call>`` everything is answer text; a partial ``<tool_call>`` at the end
  is held. A block holds one or more ``<function=NAME>...</function>``.
- A call starts (``CallStart``) as soon as ``<function=NAME>`` is complete. Its
  arguments, the JSON object ``{"key": value, ...}`` with each value read by its schema
  (``coerce``), are sent whole, as one fragment, when the call ends: a parameter the
  model writes twice in one call is one key holding the last value (where the first
  stood), with a ``tool_call_duplicate_parameter`` warning naming it, and that is only
  known once the call has ended, since a fragment sent cannot be taken back.
- A value is the text after ``<parameter=KEY>`` less one leading newline, up to
  ``</parameter>``, less one newline before it. ``</parameter>`` closes the value only
  when what follows it (after whitespace) is ``<parameter=``, ``</function>`` or
  ``</tool_call>``, so code that mentions the tag stays in the value. A value with
  neither ``</parameter>`` nor those after it runs to the end of the answer.
- ``</function>`` ends the call (``}``, ``CallEnd``); ``</tool_call>`` without it does too.
- Markup that does not parse (a block with no ``<function=NAME>``, text where a parameter
  should start) is a ``CallError`` holding its raw text up to and including
  ``</tool_call>``: a call already started ends first, keeping its complete parameters.
  Nothing of the answer is lost; the server shows the error's text as content.
- At the end of the answer, an open call ends with what it has (a value cut off is
  kept as far as it got; a partial tag is dropped), and a block that never started a
  call is a ``CallError``.

``finish().calls`` re-parses the whole answer, as the contract asks of the response.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import structlog
from mlxcel.toolcalls.kit import (
    CallArguments,
    CallEnd,
    CallError,
    CallStart,
    ParseResult,
    TextStates,
    ToolEvent,
    ToolText,
    calls_from,
    partial_suffix,
)

from mlxcel_toolcall_qwen3_coder.coerce import properties, schema_types, to_json

log = structlog.get_logger("mlxcel.toolcalls")

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
AFTER_VALUE = (PARAMETER, FUNCTION_END, CLOSE)  # what may follow a value's </parameter>
WHITESPACE = " \t\r\n"


def value_end(buf: str) -> tuple[int, int | None]:
    """Where the value in ``buf`` ends: ``(end, resume)`` when its closing tag is settled
    (``resume``: where the text after ``</parameter>`` begins), else ``(safe, None)``:
    the length of ``buf`` that is surely value text."""
    at = buf.find(PARAMETER_END)
    while at >= 0:
        end = at - 1 if at and buf[at - 1] == "\n" else at
        resume = at + len(PARAMETER_END)
        tail = buf[resume:].lstrip(WHITESPACE)
        if tail.startswith(AFTER_VALUE):
            return end, resume
        if any(m.startswith(tail) for m in AFTER_VALUE):
            return end, None  # not settled: the next text decides
        at = buf.find(PARAMETER_END, at + 1)
    return len(buf) - partial_suffix(buf, ("\n" + PARAMETER_END, PARAMETER_END)), None


def tag_name(rest: str, prefix: str) -> tuple[str | None, int]:
    """``rest`` starts with ``prefix``: the name up to ``>`` and the length of the tag;
    ``("", 0)``: not complete yet; ``(None, 0)``: not a tag (no name, or ``<`` or a newline
    before the ``>``)."""
    body = rest[len(prefix):]
    close = body.find(">")
    name = body if close < 0 else body[:close]
    if "<" in name or "\n" in name or (close >= 0 and not name.strip()):
        return None, 0
    if close < 0:
        return "", 0
    return name.strip(), len(prefix) + close + 1


class Scanner(TextStates):
    """The state machine over one answer. States: ``outside``, ``block`` (in
    ``<tool_call>``, between calls), ``function`` (in a call, between parameters),
    ``value`` (in a parameter's value), ``broken`` (unparsable markup, up to
    ``</tool_call>``)."""

    def __init__(self, schemas: dict[str, dict[str, Any]], warn: bool = True) -> None:
        super().__init__("outside")
        self.schemas, self.warn = schemas, warn
        self.raw = ""  # a block's text that is not yet part of a call (a CallError's text)
        self.why = ""  # why the markup in ``raw`` is broken
        self.index, self.block_calls = 0, 0
        self.name, self.params = "", {}  # the open call's function and parameter schemas
        self.arguments: dict[str, str] = {}  # the open call's keys -> their values' JSON
        # the open value: its key, its schema types, its text so far, and whether its
        # opening newline is settled
        self.key, self.types, self.value, self.lead = "", frozenset(), "", False

    def finish(self) -> list[ToolEvent]:
        """The end of the answer: what is held is settled (module docstring, last rule)."""
        out = self.feed("")
        if self.state == "outside" and self.buf:
            out.append(ToolText(text=self.buf))
        elif self.state == "block" and not self.block_calls:
            out.append(CallError(message="the answer ended inside a tool call",
                                 text=self.raw + self.buf))
        elif self.state == "broken":
            out.append(CallError(message=self.why, text=self.raw + self.buf))
        elif self.state == "value":
            self._lead()
            self._end_value(self.buf[:value_end(self.buf)[0]])
            self._end_call(out)
        elif self.state == "function":
            self._end_call(out)
        self.buf, self.raw, self.state = "", "", "outside"
        return out

    # Each step turns what it can of ``buf`` into events; True: run the next state's step.

    def _outside(self, out: list[ToolEvent]) -> bool:
        if not self.text_until(out, (OPEN,)):
            return False
        self.raw, self.state, self.block_calls = OPEN, "block", 0
        return True

    def _block(self, out: list[ToolEvent]) -> bool:
        rest = self.buf.lstrip(WHITESPACE)
        self.raw += self.buf[:len(self.buf) - len(rest)]
        self.buf = rest
        if rest.startswith(CLOSE):
            if not self.block_calls:
                out.append(CallError(message="a tool call with no function",
                                     text=self.raw + CLOSE))
            self.buf, self.raw, self.state = rest[len(CLOSE):], "", "outside"
            return True
        if rest.startswith(FUNCTION):
            name, size = tag_name(rest, FUNCTION)
            if name:
                self._start_call(name, out)
                self.buf = rest[size:]
                return True
            if name == "":
                return False
        elif not rest or any(m.startswith(rest) for m in (FUNCTION, CLOSE)):
            return False
        return self._break("a tool call that is not <function=NAME>")

    def _function(self, out: list[ToolEvent]) -> bool:
        rest = self.buf = self.buf.lstrip(WHITESPACE)
        if rest.startswith(PARAMETER):
            key, size = tag_name(rest, PARAMETER)
            if key:
                self._start_value(key)
                self.buf = rest[size:]
                return True
            if key == "":
                return False
        elif rest.startswith((FUNCTION_END, CLOSE)):
            self._end_call(out)
            block = rest.startswith(FUNCTION_END)
            self.buf = rest[len(FUNCTION_END if block else CLOSE):]
            self.state = "block" if block else "outside"
            return True
        elif not rest or any(m.startswith(rest) for m in (PARAMETER, FUNCTION_END, CLOSE)):
            return False
        self._end_call(out)
        return self._break("text where a <parameter=KEY> should start")

    def _value(self, out: list[ToolEvent]) -> bool:
        if not self._lead():
            return False
        end, resume = value_end(self.buf)
        if resume is None:
            self.value, self.buf = self.value + self.buf[:end], self.buf[end:]
            return False
        self._end_value(self.buf[:end])
        self.buf, self.state = self.buf[resume:], "function"
        return True

    def _broken(self, out: list[ToolEvent]) -> bool:
        at = self.buf.find(CLOSE)
        if at < 0:
            keep = len(self.buf) - partial_suffix(self.buf, (CLOSE,))
            self.raw, self.buf = self.raw + self.buf[:keep], self.buf[keep:]
            return False
        end = at + len(CLOSE)
        out.append(CallError(message=self.why, text=self.raw + self.buf[:end]))
        self.buf, self.raw, self.state = self.buf[end:], "", "outside"
        return True

    # The pieces of a call.

    def _break(self, why: str) -> bool:
        self.state, self.why = "broken", why
        return True

    def _start_call(self, name: str, out: list[ToolEvent]) -> None:
        out.append(CallStart(index=self.index, name=name))
        self.name, self.params = name, self.schemas.get(name, {})
        self.arguments, self.raw, self.state = {}, "", "function"

    def _end_call(self, out: list[ToolEvent]) -> None:
        pairs = ", ".join(f"{_dump(key)}: {value}" for key, value in self.arguments.items())
        out += [CallArguments(index=self.index, text=f"{{{pairs}}}"), CallEnd(index=self.index)]
        self.index, self.block_calls, self.raw = self.index + 1, self.block_calls + 1, ""

    def _start_value(self, key: str) -> None:
        self.key, self.value, self.lead, self.state = key, "", False, "value"
        self.types = schema_types(self.params.get(key)) if key in self.params else frozenset()

    def _lead(self) -> bool:
        """Drop the newline that opens a value; False while that is not yet known."""
        if not self.lead and self.buf:
            self.buf, self.lead = self.buf[1:] if self.buf[0] == "\n" else self.buf, True
        return self.lead

    def _end_value(self, text: str) -> None:
        """The value is complete: its JSON is the key's (a repeated key's last value)."""
        if self.key in self.arguments and self.warn:
            log.warning("tool_call_duplicate_parameter", function=self.name,
                        parameter=self.key, index=self.index)
        self.arguments[self.key] = to_json(self.value + text, self.types)


def _dump(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class Qwen3CoderParser:
    """One per answer (the contract's ``ToolCallParser``)."""

    def __init__(self, tools: Iterable[Any]) -> None:
        self.schemas = properties(tools)
        self.scanner = Scanner(self.schemas)
        self.pieces: list[str] = []

    def feed(self, text: str, token_ids: tuple[int, ...] = ()) -> list[ToolEvent]:
        self.pieces.append(text)
        return self.scanner.feed(text)

    def finish(self) -> ParseResult:
        """The held events, and the calls of the whole answer parsed afresh."""
        return ParseResult(events=tuple(self.scanner.finish()),
                           calls=parse_calls("".join(self.pieces), self.schemas))


def parse_calls(answer: str, schemas: dict[str, dict[str, Any]]) -> tuple:
    """Every call in the whole ``answer`` (``ParsedCall``), by the same rules as the stream."""
    scanner = Scanner(schemas, warn=False)  # the stream has warned already
    return calls_from([*scanner.feed(answer), *scanner.finish()])


def new_parser(tools: Iterable[Any]) -> Qwen3CoderParser:
    """What ``ToolFormat.parser`` names: a fresh parser for one request's ``tools``."""
    return Qwen3CoderParser(tools)
