"""Speech jobs on the engine's job lane, with their pieces streamed back.

A request's item rides in a batch that may hold other requests' items (the lane batches
by key), so each item carries its own ``Pieces``: the runner's ``emit(index, piece)``
(engine thread) lands on that request's event loop, in order, through
``call_soon_threadsafe``. ``stream`` yields a request's pieces as they come and ends when
its job does, raising the job's error (503, 504, a runner's failure) where it happens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from mlxcel.engine.side import SideEngine

_END = object()


class Pieces:
    """One item's pieces, from the engine thread to the request's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, piece: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, piece)
        except RuntimeError:  # the loop is gone: nobody reads these pieces any more
            pass


class Item(msgspec.Struct, frozen=True):
    """A runner's input (``Transcription`` or ``Utterance``) and where its pieces go."""

    value: Any
    pieces: Pieces | None = None


def runner_call(method: Callable[[list[Any], Any], list[Any]]) -> Callable[[list[Item]],
                                                                          list[Any]]:
    """``fn(batch)`` for the job lane: the runner's ``method(values, emit)``, with each
    emitted piece routed to its own item's request."""
    def fn(batch: list[Item]) -> list[Any]:
        def emit(index: int, piece: Any) -> None:
            sink = batch[index].pieces
            if sink is not None:
                sink.put(piece)
        return method([item.value for item in batch], emit)
    return fn


async def run(side: SideEngine, value: Any, key: Any,
              method: Callable[[list[Any], Any], list[Any]]) -> Any:
    """One item's result, nothing streamed."""
    return (await side.run([Item(value)], key, runner_call(method)))[0]


async def stream(side: SideEngine, value: Any, key: Any,
                 method: Callable[[list[Any], Any], list[Any]]
                 ) -> AsyncIterator[tuple[str, Any]]:
    """``("piece", p)`` for each piece as it is made, then ``("result", r)``. Closing the
    iterator early (the client left) cancels the job's wait."""
    pieces = Pieces()
    job = asyncio.ensure_future(side.run([Item(value, pieces)], key, runner_call(method)))
    job.add_done_callback(lambda _: pieces.put(_END))
    try:
        while True:
            piece = await pieces.queue.get()
            if piece is _END:
                break
            yield "piece", piece
        yield "result", job.result()[0]
    finally:
        if not job.done():
            job.cancel()
