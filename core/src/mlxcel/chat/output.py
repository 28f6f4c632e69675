"""Engine events -> typed deltas: one state machine per answer, for every dialect.

It is the one place that holds back text at token boundaries: a possible beginning of a
stop string, of a reasoning marker, or of a tool call's wrapper stays held until the next
text settles it, so the deltas (merged, ``merge``) are the same however the model's text
was split into tokens. The engine's events keep special tokens' text with their spans
(``GenerationEvent.specials``); here they reach the reasoning split and the tool parser,
and never the user-visible content.

The stages, in order, for each piece of an event's text:

1. stop strings, on ordinary text (``mlxcel.text.StopMatcher``, the engine's own rule for
   where generation ends): text after a stop is dropped, a special token ends a partial
   match;
2. the reasoning split at the model's reasoning markers, when it has them
   (``chat.reasoning``; the prompt may leave the answer inside an open block:
   ``reasoning_open``); reasoning text never reaches the tool parser;
3. the tool parser on the answer text, when the request has tools and the model a format
   (it sees special tokens' text; what it passes through as content loses them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import structlog

from mlxcel.chat.call_ids import new_call_id
from mlxcel.chat.reasoning import splitter
from mlxcel.families.api import ReasoningSpec
from mlxcel.lazy import resolve
from mlxcel.text import StopMatcher
from mlxcel.toolcalls.api import ToolCallParser
from mlxcel.types import (
    ContentDelta,
    Delta,
    Finish,
    GenerationEvent,
    ReasoningDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from mlxcel.types.toolcalls import (
    CallArguments,
    CallEnd,
    CallStart,
    ParsedCall,
    ToolEvent,
    ToolText,
)

log = structlog.get_logger("mlxcel.chat")

Piece = tuple[str, bool]  # (text, is a special token's text)


def pieces(event: GenerationEvent) -> list[Piece]:
    """An event's text cut at its special tokens' spans."""
    if not event.specials:
        return [(event.text, False)] if event.text else []
    out: list[Piece] = []
    at = 0
    for start, end in event.specials:
        if start > at:
            out.append((event.text[at:start], False))
        out.append((event.text[start:end], True))
        at = end
    if at < len(event.text):
        out.append((event.text[at:], False))
    return out


class _Tools:
    """Adapts a tool parser's events to deltas; without a parser, answer text is content
    and special tokens' text is dropped. At the end the parser's whole-answer calls are
    authoritative: a streamed call keeps its id and gets the arguments it is missing, a
    call never streamed is sent whole, and a stream that went another way is logged."""

    def __init__(self, parser: ToolCallParser | None, specials: Iterable[str],
                 request_id: str | None, call_ids: str = "any") -> None:
        self.parser = parser
        self.call_ids = call_ids  # the id form the template takes back (chat.call_ids)
        self.markers = _marker_pattern(tuple(specials)) if parser is not None else None
        self.request_id = request_id
        self.streamed: dict[int, list] = {}  # index -> [id, name, arguments so far, ended]
        self.broken: set[int] = set()  # started calls that did not parse (CallError.index)
        self.token_ids: tuple[int, ...] = ()  # the tokens behind the event being fed

    def feed(self, text: str, special: bool) -> list[Delta]:
        if self.parser is None:
            return [] if special else [ContentDelta(text=text)]
        return self._deltas(self.parser.feed(text, self.token_ids))

    def finish(self) -> tuple[list[Delta], tuple[ParsedCall, ...]]:
        if self.parser is None:
            return [], ()
        result = self.parser.finish()
        out = self._deltas(result.events)
        calls = []
        for i, call in zip(self._slots(len(result.calls)), result.calls, strict=True):
            out += self._settle(i, call)
            calls.append(ParsedCall(name=call.name, arguments=call.arguments,
                                    id=self.streamed[i][0]))
        if len(self.streamed) - len(self.broken) > len(result.calls):
            log.warning("tool_call_divergence", request_id=self.request_id,
                        streamed=len(self.streamed), parsed=len(result.calls))
        return out, tuple(calls)

    def _slots(self, n: int) -> list[int]:
        """The stream indices of the answer's ``n`` calls: the started calls that did not
        break, in order, then new indices for calls the stream never started."""
        slots = [i for i in sorted(self.streamed) if i not in self.broken]
        after = max([*self.streamed, -1]) + 1
        return (slots + list(range(after, after + n)))[:n]

    def _settle(self, i: int, call: ParsedCall) -> list[Delta]:
        """The deltas that bring streamed call ``i`` to the authoritative ``call``."""
        if i not in self.streamed:
            self.streamed[i] = [call.id or new_call_id(self.call_ids), call.name, "", False]
            out: list[Delta] = [ToolCallStart(index=i, id=self.streamed[i][0], name=call.name)]
        else:
            out = []
        cid, name, sent, ended = self.streamed[i]
        if name != call.name or not call.arguments.startswith(sent):
            log.warning("tool_call_divergence", request_id=self.request_id, index=i)
        elif len(call.arguments) > len(sent):
            out.append(ToolCallArguments(index=i, text=call.arguments[len(sent):]))
        return out if ended else [*out, ToolCallEnd(index=i)]

    def _visible(self, text: str) -> str:
        return self.markers.sub("", text) if self.markers is not None else text

    def _deltas(self, events: Iterable[ToolEvent]) -> list[Delta]:
        out: list[Delta] = []
        for e in events:
            if isinstance(e, ToolText):
                if text := self._visible(e.text):
                    out.append(ContentDelta(text=text))
            elif isinstance(e, CallStart):
                self.streamed[e.index] = [e.id or new_call_id(self.call_ids), e.name, "",
                                          False]
                out.append(ToolCallStart(index=e.index, id=self.streamed[e.index][0],
                                         name=e.name))
            elif isinstance(e, CallArguments):
                self.streamed[e.index][2] += e.text
                out.append(ToolCallArguments(index=e.index, text=e.text))
            elif isinstance(e, CallEnd):
                self.streamed[e.index][3] = True
                out.append(ToolCallEnd(index=e.index))
            else:  # markup that does not parse: nothing of the answer is lost
                log.warning("tool_call_unparsed", request_id=self.request_id,
                            reason=e.message, index=e.index)
                if e.index is not None:
                    self.broken.add(e.index)
                if text := self._visible(e.text):
                    out.append(ContentDelta(text=text))
        return out


@lru_cache(maxsize=16)
def _marker_pattern(markers: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pass that removes every special token's text (longest first, so a marker that
    contains another goes whole); made once per tokenizer's marker set."""
    if not markers:
        return None
    return re.compile("|".join(re.escape(m) for m in sorted(set(markers), key=len,
                                                              reverse=True)))


def _substantial(delta: Delta) -> bool:
    """A delta that is more than whitespace (or a logprobs placeholder)."""
    return not isinstance(delta, (ContentDelta, ReasoningDelta)) or bool(delta.text.strip())


class OutputMachine:
    """One answer's state: feed it the request's engine events in order, get deltas."""

    def __init__(self, *, stops: tuple[str, ...] = (),
                 reasoning: ReasoningSpec | None = None, reasoning_open: bool = False,
                 tool_parser: ToolCallParser | None = None,
                 special_texts: Iterable[str] = (), request_id: str | None = None,
                 forced: bool = False, legacy_reasoning: bool = False,
                 call_ids: str = "any") -> None:
        self._stops = StopMatcher(stops)
        self._reasoning = splitter(reasoning, reasoning_open) if reasoning else None
        self._legacy = legacy_reasoning  # reasoning also stays in the content, markers too
        self._emitted: set[type] = set()  # the kinds of delta this answer has produced
        self._tools = _Tools(tool_parser, special_texts, request_id, call_ids)
        self._calls: tuple[ParsedCall, ...] = ()
        self._forced = forced  # tool_choice required a call: an answer without one is logged
        self._request_id = request_id
        self._stopped = False  # a stop string matched: later text is not the answer's
        self.done = False

    def feed(self, event: GenerationEvent) -> list[Delta]:
        """The deltas one event settles. Its logprobs ride on the last text delta it
        produced, or on an empty content delta when it produced none."""
        if event.finish_reason is None and not (event.specials or event.logprobs
                                                or self._stopped):
            return self._feed_text(event)
        out: list[Delta] = []
        self._tools.token_ids = event.token_ids
        for text, special in pieces(event):
            if self._stopped:
                break
            if special:
                out += self._route(self._stops.flush(), False)
                out += self._route(text, True)
                continue
            safe, hit = self._stops.feed(text)
            out += self._route(safe, False)
            self._stopped = hit
        if event.finish_reason is not None:
            out += self._finish_text()
        out = self._with_logprobs(out, event.logprobs)
        self._emitted.update(type(d) for d in out if _substantial(d))
        if event.finish_reason is not None:
            self.done = True
            reason = event.finish_reason
            if reason == "stop" and self._calls:
                reason = "tool_calls"
            elif self._forced and not self._calls and reason in ("stop", "length"):
                log.warning("tool_choice_unmet", request_id=self._request_id)
            out.append(Finish(reason=reason, usage=event.usage, error=event.error,
                              calls=self._calls, reasoning_only=self._reasoning_only(),
                              stop_sequence=self._stops.matched))
        return out

    def _feed_text(self, event: GenerationEvent) -> list[Delta]:
        """``feed`` for the common event (ordinary text, no logprobs, not the last): the
        same stages in fewer steps, since it runs on the event loop once per token."""
        self._tools.token_ids = event.token_ids
        if not event.text:
            return []
        safe, self._stopped = self._stops.feed(event.text)
        out = self._route(safe, False)
        if len(out) > 1:
            out = merge(out)
        for d in out:
            if _substantial(d):
                self._emitted.add(type(d))
        return out

    def _route(self, text: str, special: bool) -> list[Delta]:
        if not text:
            return []
        if self._reasoning is None:
            return self._tools.feed(text, special)
        return self._runs(self._reasoning.feed(text, special))

    def _runs(self, runs: Iterable[tuple[str, str, bool]]) -> list[Delta]:
        out: list[Delta] = []
        for kind, run, special in runs:
            if kind == "answer":
                out += self._tools.feed(run, special)
            elif kind == "reasoning" and not special:
                out.append(ReasoningDelta(text=run))
                if self._legacy:
                    out.append(ContentDelta(text=run))
            elif kind == "marker" and self._legacy:
                out.append(ContentDelta(text=run))
        return out

    def _finish_text(self) -> list[Delta]:
        out = [] if self._stopped else self._route(self._stops.flush(), False)
        if self._reasoning is not None:
            out += self._runs(self._reasoning.flush())
        settled, self._calls = self._tools.finish()
        return out + settled

    def _reasoning_only(self) -> bool:
        """Every generated token stayed in the reasoning: reasoning was produced, and no
        content (beyond whitespace) and no call. The spec's ``reasoning_only`` flag."""
        return ReasoningDelta in self._emitted and ContentDelta not in self._emitted \
            and not self._calls

    @staticmethod
    def _with_logprobs(out: list[Delta], lps: tuple[TokenLogprob, ...]) -> list[Delta]:
        """Text deltas of one event merged per kind; the logprobs on the last of them."""
        merged = merge(out)
        if not lps:
            return merged
        for i in range(len(merged) - 1, -1, -1):
            d = merged[i]
            if isinstance(d, (ContentDelta, ReasoningDelta)):
                merged[i] = type(d)(text=d.text, logprobs=d.logprobs + lps)
                return merged
        return [*merged, ContentDelta(logprobs=lps)]


def merge(deltas: Iterable[Delta]) -> list[Delta]:
    """Adjacent content (or reasoning, or one call's argument) deltas as one: what a
    client that concatenates them sees, whatever the chunking."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if isinstance(d, (ContentDelta, ReasoningDelta)) and type(last) is type(d):
            out[-1] = type(d)(text=last.text + d.text, logprobs=last.logprobs + d.logprobs)
        elif isinstance(d, ToolCallArguments) and isinstance(last, ToolCallArguments) \
                and last.index == d.index:
            out[-1] = ToolCallArguments(index=d.index, text=last.text + d.text)
        else:
            out.append(d)
    return out


def answer_machine(checkpoint: Any, req: Any, prompt: Any) -> OutputMachine:
    """The state machine of one chat answer: the request's stops, the checkpoint's
    reasoning spec (none with ``--reasoning-format none``), and its tool format when the
    prompt declared tools (a parser per answer, fed special tokens' text, which content
    never shows); call ids the server makes are ones its template takes back."""
    fmt = checkpoint.tool_format if prompt.tools else None
    parser = resolve(fmt.parser)(prompt.tools) if fmt is not None else None
    specials = checkpoint.tokenizer.special_markers if parser is not None else ()
    split = checkpoint.reasoning if checkpoint.reasoning_format != "none" else None
    return OutputMachine(stops=req.stop, reasoning=split,
                         reasoning_open=prompt.reasoning_open, tool_parser=parser,
                         special_texts=specials, request_id=req.request_id,
                         forced=prompt.forced,
                         legacy_reasoning=checkpoint.reasoning_format == "deepseek-legacy",
                         call_ids=checkpoint.template.caps.call_ids)
