"""A whole answer from the output state machine: what a non-streaming response holds."""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass, field

from mlxcel.chat.output import OutputMachine
from mlxcel.errors import GenerationFailed
from mlxcel.types import (
    ContentDelta,
    Delta,
    Finish,
    GenerationEvent,
    ReasoningDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallStart,
)


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""


@dataclass
class Answer:
    """Every delta of one answer, gathered; ``finish`` is set once it ended well."""

    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None

    def add(self, delta: Delta) -> None:
        if isinstance(delta, ContentDelta):
            self.content += delta.text
            self.logprobs.extend(delta.logprobs)
        elif isinstance(delta, ReasoningDelta):
            self.reasoning += delta.text
            self.logprobs.extend(delta.logprobs)
        elif isinstance(delta, ToolCallStart):
            self.calls.append(Call(delta.id, delta.name))
        elif isinstance(delta, ToolCallArguments):
            self.calls[-1].arguments += delta.text
        elif isinstance(delta, Finish):
            self.finish = delta
            if delta.calls:  # the whole answer's parse is authoritative
                self.calls = [Call(c.id or "", c.name, c.arguments) for c in delta.calls]


def failure(finish: Finish) -> str:
    """The message a client gets for an answer that ended without finishing."""
    if finish.reason == "cancelled":
        return "the generation was cancelled"
    return finish.error or "the generation failed"


async def collect(events: AsyncIterable[GenerationEvent], machine: OutputMachine) -> Answer:
    """The whole answer; an engine failure raises ``GenerationFailed`` with its message."""
    answer = Answer()
    async for event in events:
        for delta in machine.feed(event):
            answer.add(delta)
        if answer.finish is not None:
            if not answer.finish.ok:
                raise GenerationFailed(failure(answer.finish))
            return answer
    raise GenerationFailed("the engine stream ended without a finish event")
