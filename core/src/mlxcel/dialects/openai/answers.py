"""Answering a chat or text completion on the OpenAI routes: one choice (a ``Turn``) or n
(``dialects.choices.Choices``), whole or streamed, with llama-server's ``timings`` on its
frames when the request asked for ``timings_per_token``, and on its finish (the body, or
the frame with ``finish_reason``) when a drafter ran a verify round for it (the spec's
speculative timings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Request

from mlxcel.context import AppContext
from mlxcel.dialects.choices import Choices, combined_usage, stream_choices
from mlxcel.dialects.timings import Watch
from mlxcel.dialects.turn import Turn
from mlxcel.dialects.wire import SSEResponse, client_closed, stream_answer

from .stream import wire_usage
from .verbose import with_verbose

# (choice index, whether its finish ends the stream, timed) -> that choice's encoder
MakeEncoder = Callable[[int, bool, "tuple[Watch, int, bool] | None"], Any]


def _timed(per_token: bool, streams: list[Any], prompt_n: int
           ) -> list[tuple[Watch, int, bool]]:
    """Each choice's ``Watch`` (wrapping its stream in place), its prompt length, and
    whether every frame carries ``timings`` (``timings_per_token``)."""
    streams[:] = [Watch(s) for s in streams]
    return [(s, prompt_n, per_token) for s in streams]


async def answer(ctx: AppContext, request: Request, turn: Turn | Choices, make: MakeEncoder,
                 *, stream: bool, timings: bool, metrics: bool = True) -> Any:
    """The response: a JSON body, or an SSE stream (``metrics``: a streamed answer is
    recorded in the request metrics when it ends)."""
    prompt_n = len(turn.request.prompt_tokens)
    if isinstance(turn, Choices):
        return await _many(ctx, request, turn, make, stream=stream, timings=timings,
                           metrics=metrics)
    box = [turn.stream]
    timed = _timed(timings, box, prompt_n)[0]
    turn.stream = box[0]
    encoder = make(0, True, timed)
    if not stream:
        whole = await turn.whole(ctx, request)
        return client_closed() if whole is None else with_verbose(
            encoder.whole(whole), whole, encoder.model, ctx.settings.verbose)
    return SSEResponse(stream_answer(request, turn.stream, turn.machine, encoder,
                                     on_finish=turn.on_finish(ctx) if metrics else None))


async def _many(ctx: AppContext, request: Request, choices: Choices, make: MakeEncoder, *,
                stream: bool, timings: bool, metrics: bool) -> Any:
    timed = _timed(timings, choices.streams, len(choices.request.prompt_tokens))
    encoders = [make(i, False, t) for i, t in enumerate(timed)]
    if stream:
        return SSEResponse(stream_choices(request, choices, encoders, encoders[0].closing,
                                          on_finish=choices.on_finish(ctx) if metrics
                                          else None))
    answers = await choices.whole(ctx, request)
    if answers is None:
        return client_closed()
    body = encoders[0].whole(answers[0])
    body.choices = [e.choice(a) for e, a in zip(encoders, answers, strict=True)]
    body.usage = wire_usage(combined_usage([a.finish.usage for a in answers]))
    return with_verbose(body, answers[0], encoders[0].model, ctx.settings.verbose)
