"""State of one generating sequence inside the engine thread."""

from __future__ import annotations

import time
from typing import Protocol

from mlxcel.engine.detokenizer import IncrementalDetokenizer
from mlxcel.engine.sampling import RowRandom
from mlxcel.engine.stops import StopMatcher
from mlxcel.engine.tokenizer import Tokenizer
from mlxcel.types import FinishReason, GenerationEvent, GenerationRequest, Usage


class Sink(Protocol):
    """Where a sequence's events go; ``cancelled`` turns true when the consumer is gone."""

    cancelled: bool

    def emit(self, event: GenerationEvent) -> None: ...


class Sequence:
    """Per-request state: detokenizer, stop matcher, PRNG; the KV cache lives in the batch."""

    def __init__(self, req: GenerationRequest, sink: Sink, tokenizer: Tokenizer,
                 eos_ids: set[int], order: int) -> None:
        self.req = req
        self.sink = sink
        self.order = order  # FIFO tie-break within a priority lane
        self.eos_ids = set() if req.ignore_eos else eos_ids
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(req.stop)
        self.random = RowRandom(req.sampling.seed)
        self.generated = 0
        self.finished = False
        self.submitted_at = time.perf_counter()

    def __lt__(self, other: Sequence) -> bool:  # heap order: priority lane, then arrival
        return (self.req.priority, self.order) < (other.req.priority, other.order)

    def usage(self) -> Usage:
        return Usage(prompt_tokens=len(self.req.prompt_tokens), completion_tokens=self.generated)

    def emit(self, event: GenerationEvent) -> None:
        self.sink.emit(event)

    def accept(self, token: int) -> None:
        """Take one sampled token: emit text, or finish on EOS / stop / max_tokens."""
        self.generated += 1
        if token in self.eos_ids:
            self.finish("stop", self.stops.feed(self.detok.flush())[0] + self.stops.flush())
            return
        text, hit = self.stops.feed(self.detok.add(token))
        if hit:
            self.finish("stop", text, token)
        elif self.generated >= self.req.max_tokens:
            tail, hit = self.stops.feed(self.detok.flush())
            self.finish("stop" if hit else "length",
                        text + tail + ("" if hit else self.stops.flush()), token)
        else:
            self.emit(GenerationEvent(text=text, token_ids=(token,)))

    def finish(self, reason: FinishReason, text: str = "", token: int | None = None,
               error: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.emit(GenerationEvent(text=text, token_ids=() if token is None else (token,),
                                  finish_reason=reason, usage=self.usage(), error=error))
