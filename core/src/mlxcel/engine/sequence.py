"""State of one generating sequence inside the engine thread."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from mlxcel.engine.budget import ReasoningBudget
from mlxcel.engine.lazy_guide import LazyTrigger
from mlxcel.engine.sampling import RowRandom
from mlxcel.model.detokenizer import IncrementalDetokenizer
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.text import StopMatcher
from mlxcel.types import FinishReason, GenerationEvent, GenerationRequest, TokenLogprob, Usage

log = structlog.get_logger("mlxcel.engine")


class Sink(Protocol):
    """Where a sequence's events go; ``cancelled`` turns true when the consumer is gone.
    A sink may also take ``prefill_started(at)``: when the engine began computing the
    prompt (``time.perf_counter()``), once."""

    cancelled: bool

    def emit(self, event: GenerationEvent) -> None: ...


class DraftCounts:
    """A row's speculative rounds: what it drafted, what was kept, and the drafter's kind."""

    __slots__ = ("accepted", "drafted", "kind", "rounds")

    def __init__(self) -> None:
        self.drafted = self.accepted = self.rounds = 0
        self.kind = ""


class Sequence:
    """Per-request state: detokenizer, stop matcher, PRNG; the KV cache lives in the batch."""

    def __init__(self, req: GenerationRequest, sink: Sink, tokenizer: Tokenizer,
                 eos_ids: set[int], order: int) -> None:
        prompt = req.prompt_tokens
        if not prompt or min(prompt) < 0 or max(prompt) >= tokenizer.vocab_size:
            raise ValueError("the prompt is empty or holds a token id outside the vocabulary")
        self.req = req
        self.sink = sink
        self.order = order  # FIFO tie-break within a priority lane
        self.eos_ids = set() if req.ignore_eos else eos_ids
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(req.stop)
        self.random = RowRandom(req.sampling.seed)
        self.context: list[int] = list(req.prompt_tokens)  # prompt + generated
        self.loop = req.loop if req.loop is not None and req.loop.enabled else None
        self.generated = 0
        self.cached = 0  # prompt tokens taken from the prompt cache
        self.fed_from = 0  # its batch's ``DecodeBatch.fed`` = this + the batch's steps
        self.cache_hit: Any = None  # the prompt cache's Hit at admission, () for none
        # the prompt's block hashes, from its lookup (``cache.entries.prompt_hashes``)
        self.prompt_hashes: list[bytes] = []
        self.checkpoints: list[Any] = []  # taken while prefilling (``cache.capture``)
        self.finished = False
        # admitted alone: its group could not be set up with it, or its group's prefill
        # failed (``Admission._alone_again``)
        self.solo = False
        # its prompt holds media: it prefills from input embeddings, in groups of media
        # rows only (``engine.media_rows``)
        self.media = req.media is not None
        # n choices of one prompt (``engine.fork``): the row whose prefill a follower
        # copies, and a leader's followers
        self.leader: Sequence | None = None
        self.followers: list[Sequence] = []
        self.position_shift = 0  # added to its decode positions (``media_rows.shifts``)
        self.defer_finish = False  # hold the finish event until release_finish()
        self.drafts = DraftCounts()  # speculative decoding's rounds for this request
        self._final: GenerationEvent | None = None
        self.submitted_at = time.perf_counter()
        guide = req.guide
        self.lazy = None if guide is None or req.guide_lazy is None \
            else LazyTrigger(req.guide_lazy, tokenizer)
        self.matcher = None if guide is None else guide.matcher(
            active=req.guide_after is None and self.lazy is None)
        if (limit := req.reasoning_limit) is not None:
            self.matcher = ReasoningBudget(self.matcher, limit.budget, limit.open, limit.close,
                                           limit.close_ids, limit.inside)
        self._before_guide = ""  # the output's tail while the constraint waits to start
        self._prefill_told = False

    def __lt__(self, other: Sequence) -> bool:  # heap order: priority lane, then arrival
        return (self.req.priority, self.order) < (other.req.priority, other.order)

    def usage(self) -> Usage:
        d = self.drafts
        return Usage(prompt_tokens=len(self.req.prompt_tokens), completion_tokens=self.generated,
                     cached_tokens=self.cached, draft_n=d.drafted,
                     draft_n_accepted=d.accepted, draft_rounds=d.rounds,
                     draft_kind=d.kind if d.rounds else None)

    def emit(self, event: GenerationEvent) -> None:
        self.sink.emit(event)

    def prefill_started(self, at: float) -> None:
        """Tell the sink, once, when the engine began computing this prompt (a prefill
        group's start: the time it waited in the queue is not the prompt's)."""
        if self._prefill_told:
            return
        self._prefill_told = True
        told = getattr(self.sink, "prefill_started", None)
        if told is not None:
            told(at)

    @property
    def generated_ids(self) -> list[int]:
        return self.context[len(self.req.prompt_tokens):]

    def accept(self, token: int, logprob: TokenLogprob | None = None) -> None:
        """Take one sampled token: emit its text, or finish on EOS / stop / loop /
        max_tokens. Text goes out as soon as it is decoded: holding back what may begin a
        stop string, and cutting at one, is the chat layer's work (``chat.output``); the
        engine only decides, by the same rule, where generation ends."""
        self.generated += 1
        self.context.append(token)
        lps = (logprob,) if logprob is not None else ()
        if self.matcher is not None and not self.matcher.advance(token):
            raise RuntimeError(f"token {token} is outside the output constraint")
        if token in self.eos_ids or (self.matcher is not None and self.matcher.finished):
            self.finish("stop", self.detok.flush(), logprobs=lps)
            return
        text, span = self.detok.add(token)
        specials = () if span is None else (span,)
        if isinstance(self.matcher, ReasoningBudget):
            self.matcher.observe(text)
            if self.matcher.waiting:
                self._start_guide(token, text)
        elif self.matcher is not None and not self.matcher.active:
            self._start_guide(token, text)
        if self._stop_in(text, span) or (self.loop is not None and self._loop_may_stop()
                                         and self._looping()):
            self.finish("stop", text, token, logprobs=lps, specials=specials)
        elif self.generated >= self.req.max_tokens:
            tail = self.detok.flush()
            hit = self.stops.feed(tail)[1]
            self.finish("stop" if hit else "length", text + tail, token, logprobs=lps,
                        specials=specials)
        else:
            self.emit(GenerationEvent(text=text, token_ids=(token,), logprobs=lps,
                                      specials=specials))

    def _start_guide(self, token: int, text: str) -> None:
        """Start the constraint at its lazy trigger (``lazy_guide``: the text from the
        trigger on is fed through it, and a grammar that refuses it fails the row), or
        once the output holds ``guide_after`` (it may arrive split over tokens, so a tail
        as long as the marker is kept)."""
        if self.lazy is not None:
            replay = self.lazy.see(token, text)
            if replay is not None:
                self.lazy = None
                self.matcher.start()
                if not all(self.matcher.advance(t) for t in replay):
                    raise RuntimeError("the output from the grammar's trigger on does not "
                                       "match the grammar")
            return
        marker = self.req.guide_after or ""
        seen = self._before_guide + text
        if marker in seen:
            self.matcher.start()
        self._before_guide = seen[-len(marker):] if marker else ""

    def _stop_in(self, text: str, span: tuple[int, int] | None) -> bool:
        """Whether a stop string completes in ``text``. Stops match ordinary text only, and
        a special token ends any partial match (``chat.output`` applies the same rule)."""
        if span is None:
            return self.stops.feed(text)[1]
        hit = self.stops.feed(text[:span[0]])[1]
        self.stops.flush()
        return hit

    def _loop_may_stop(self) -> bool:
        """A row inside an output constraint it has not yet matched is never stopped for a
        loop: the cut would leave a call or JSON value that does not parse (the constraint
        and ``max_tokens`` bound it instead)."""
        m = self.matcher
        return m is None or not m.active or m.accepting

    def _looping(self) -> bool:
        """True when the generated tail is one pattern repeated ``min_count`` times."""
        loop, gen = self.loop, self.generated_ids
        count = loop.min_count
        for size in range(max(1, loop.min_pattern_size), loop.max_pattern_size + 1):
            if size * count > len(gen):
                break
            pattern = gen[-size:]
            if all(gen[-size * (r + 1): len(gen) - size * r] == pattern for r in range(1, count)):
                return True
        return False

    def finish(self, reason: FinishReason, text: str = "", token: int | None = None,
               error: str | None = None, logprobs: tuple[TokenLogprob, ...] = (),
               specials: tuple[tuple[int, int], ...] = ()) -> None:
        if self.finished:
            return
        self.finished = True
        event = GenerationEvent(text=text, token_ids=() if token is None else (token,),
                                logprobs=logprobs, finish_reason=reason, usage=self.usage(),
                                error=error, specials=specials)
        if self.defer_finish:
            self._final = event
        else:
            self.emit(event)

    def release_finish(self) -> None:
        """Emit a held finish event (the engine first stores the KV in the prompt cache, so
        a client's next turn, sent on this event, can already hit it)."""
        self.defer_finish = False
        if self._final is not None:
            event, self._final = self._final, None
            self.emit(event)


def fail_alone(seq: Sequence, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, work done for ``seq`` alone; if it raises, ``seq`` finishes with an
    error and None is returned. Every per-row step of the engine runs through this, so one
    request's inputs can fail only that request, never the batch around it."""
    try:
        return fn(*args)
    except Exception as exc:
        log.exception("row_failed", request_id=seq.req.request_id)
        seq.finish("error", error=f"generation failed: {type(exc).__name__}: {exc}")
        return None


def error_event(message: str) -> GenerationEvent:
    """The finish event of a request that ends with an error before it had a sequence."""
    return GenerationEvent(finish_reason="error", error=message,
                           usage=Usage(prompt_tokens=0, completion_tokens=0))


def end_all(seqs: list[Sequence], inbox: queue.Queue | None, message: str) -> None:
    """End every sequence with an error (held finish events go out as they are), then every
    request still in ``inbox``: no client may be left waiting on an engine that stops."""
    for seq in seqs:
        seq.finish("error", error=message)
        seq.release_finish()
    while inbox is not None:
        try:
            item = inbox.get_nowait()
        except queue.Empty:
            return
        # a request, or a fork's n (``engine.fork.Fork``)
        for _, sink in getattr(item, "members", [item] if item is not None else []):
            sink.emit(error_event(message))
