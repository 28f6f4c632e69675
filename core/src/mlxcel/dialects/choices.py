"""A request for n choices (OpenAI's ``n``, llama-server's ``n_cmpl``): n answers of one
prompt, submitted together so that the engine prefills the prompt once
(``engine.fork``) and decodes the n rows in one batch.

Choice i samples with its own generator: with a request seed s, choice i's seed is s + i
(llama-server's rule for its child tasks), so the choices differ and a seeded request
repeats; without one, each row draws its own. The answers' usage counts the prompt once
and the completion tokens of every choice, as OpenAI reports it. A stream interleaves the
choices' frames as their tokens come, each frame naming its choice's ``index``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
from litestar import Request

from mlxcel.chat.answer import Answer, collect, failure
from mlxcel.chat.output import OutputMachine, answer_machine
from mlxcel.dialects.wire import SSE_DONE, error_frame, record_usage, unless_disconnected
from mlxcel.errors import InvalidRequest
from mlxcel.types import Finish, GenerationEvent, GenerationRequest, Usage

MAX_CHOICES = 128  # OpenAI's bound on ``n``


def check_choices(ctx: Any, n: Any, param: str = "n") -> int:
    """``n`` when the server can run that many choices of one request: at least 1, at
    most ``MAX_CHOICES`` and at most the slots (``--parallel``: the n rows decode
    together, as llama-server bounds ``n_cmpl``); else a 400 naming ``param``."""
    if type(n) is not int or n < 1:
        raise InvalidRequest(f"'{param}' must be a positive integer", param=param)
    slots = ctx.engine.parallel
    if n > min(MAX_CHOICES, slots):
        raise InvalidRequest(
            f"'{param}' is {n}, more than this server runs for one request "
            f"(at most {min(MAX_CHOICES, slots)}: one slot per choice; the server has "
            f"--parallel {slots})", param=param)
    return n


def choice_requests(req: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The n choices' requests: ``req`` first, then copies with derived seeds (module
    docstring) and their own request ids."""
    out = [req]
    for i in range(1, n):
        seed = req.sampling.seed
        sampling = msgspec.structs.replace(req.sampling,
                                           seed=None if seed is None else seed + i)
        out.append(msgspec.structs.replace(req, request_id=f"{req.request_id}-{i}",
                                           sampling=sampling))
    return out


def combined_usage(usages: Sequence[Usage]) -> Usage:
    """The request's usage: its prompt once (the first choice's, with what the prompt
    cache served) and every choice's completion tokens."""
    first = usages[0]
    return Usage(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
                 completion_tokens=sum(u.completion_tokens for u in usages))


def combined_finish(finishes: Sequence[Finish]) -> Finish:
    """One finish for the logs and metrics: the first choice's, with the combined usage."""
    usage = combined_usage([f.usage for f in finishes if f.usage is not None])
    return msgspec.structs.replace(finishes[0], usage=usage)


class Choices:
    """n submitted choices of one rendered prompt: their requests, event streams and
    answer state machines (``machines[i]`` reads ``streams[i]``)."""

    def __init__(self, ctx: Any, prompt: Any, req: GenerationRequest, n: int,
                 machine: Callable[[GenerationRequest], OutputMachine] | None = None) -> None:
        """``machine``: a choice's state machine from its request (default: the chat
        answer's, ``chat.output.answer_machine``, for ``prompt``)."""
        self.started = time.perf_counter()
        self.prompt, self.request = prompt, req
        self.requests = choice_requests(req, n)
        make = machine or (lambda r: answer_machine(ctx.checkpoint, r, prompt))
        self.machines = [make(r) for r in self.requests]
        self.streams = ctx.engine.submit_choices(self.requests)

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    async def _answers(self) -> list[Answer]:
        try:
            return list(await asyncio.gather(*(
                collect(s, m) for s, m in zip(self.streams, self.machines, strict=True))))
        finally:
            self.cancel()  # no-op for the finished; one failure stops the others

    async def whole(self, ctx: Any, request: Request) -> list[Answer] | None:
        """Every choice's answer (recorded once in logs and metrics); None when the client
        left first (the generations are cancelled)."""
        answers = await unless_disconnected(request, self._answers(), self.cancel)
        if answers is not None:
            finish = combined_finish([a.finish for a in answers if a.finish is not None])
            record_usage(request, finish)
            ctx.metrics.record(finish, self.started)
        return answers

    def on_finish(self, ctx: Any) -> Callable[[Finish], None]:
        return lambda finish: ctx.metrics.record(finish, self.started)


async def merged(streams: Sequence[Any]) -> AsyncIterator[tuple[int, GenerationEvent]]:
    """The events of ``streams`` as they arrive, each with its stream's index."""
    queue: asyncio.Queue[tuple[int, GenerationEvent | None]] = asyncio.Queue()

    async def pump(i: int, stream: Any) -> None:
        try:
            async for event in stream:
                queue.put_nowait((i, event))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, event = await queue.get()
            if event is None:
                left -= 1
            else:
                yield i, event
    finally:
        for task in tasks:
            task.cancel()


async def stream_choices(request: Request, choices: Choices, encoders: Sequence[Any],
                         closing: Callable[[Usage], list[bytes]],
                         on_finish: Callable[[Finish], None] | None = None
                         ) -> AsyncIterator[bytes]:
    """The frames of n streamed choices: each choice's opening frame, then their frames
    interleaved as events come (``encoders[i]`` writes choice i's, its last frame being
    its finish frame), then ``closing(usage)`` once every choice has finished. A failed
    choice ends the stream with an error frame and ``[DONE]``."""
    finishes: dict[int, Finish] = {}
    try:
        for encoder in encoders:
            first = encoder.first()
            if first:
                yield first
        async for i, event in merged(choices.streams):
            if event.progress is not None:
                frames = getattr(encoders[i], "progress", None)
                if frames is not None:
                    yield b"".join(frames(event.progress))
                continue
            deltas = choices.machines[i].feed(event)
            finish = deltas[-1] if deltas and isinstance(deltas[-1], Finish) else None
            if finish is not None and not finish.ok:
                yield b"".join([*encoders[i].encode(deltas[:-1]),
                                error_frame(failure(finish)), SSE_DONE])
                return
            out = encoders[i].encode(deltas)
            if finish is not None:
                finishes[i] = finish
                if len(finishes) == len(encoders):
                    whole = combined_finish([finishes[k] for k in sorted(finishes)])
                    record_usage(request, whole)
                    if on_finish is not None:
                        on_finish(whole)
                    assert whole.usage is not None
                    out = [*out, *closing(whole.usage)]
            if out:
                yield b"".join(out)
    finally:
        choices.cancel()
