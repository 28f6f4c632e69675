"""What rank 0 tells the followers: the engine operations it runs, in its order.

A ``Message`` is one broadcast: the operations rank 0 ran since the previous one, the
last of them usually the step the ranks now run together (a prefill chunk or a decode
step). Followers apply them in order to their own ``EngineWorker`` state, so batch
layout, caches and prompt-cache entries stay the same on every rank while only rank 0
decides: admission, cancellation, finishes, prompt-cache hits and evictions, memory.
An empty message is a heartbeat (rank 0 idle). Operations name sequences by rank 0's
``Sequence.order``, unique in the process.
"""

from __future__ import annotations

import msgspec


class Row(msgspec.Struct, array_like=True, frozen=True):
    """A sequence that starts prefilling: its prompt, and the prompt-cache entry it
    reuses (``entry`` -1: none) with how many tokens of it rank 0 found."""

    order: int
    prompt: tuple[int, ...]
    entry: int = -1
    hit: int = 0


class Admit(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A prefill group starts (``EngineWorker._start``)."""

    rows: tuple[Row, ...]


class PrefillStep(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The prefilling group computes one chunk (``PrefillJob.step(budget, chunk)``)."""

    budget: int
    chunk: int


class DropJob(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The prefilling group has no live row left and goes."""


class Join(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The prefilled groups whose rows are not all finished join the batch."""


class Drop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The batch drops its finished rows (``DecodeBatch.drop_finished``)."""


class Launch(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """One decode step is built and queued for every row of the batch."""


class ReadBack(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The oldest queued decode step's tokens go to their (unfinished) rows."""


class Finish(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """These sequences finished on rank 0 (any reason: stop, length, error, client)."""

    orders: tuple[int, ...]


class Store(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Rank 0 stored these rows in its prompt cache; ``events`` are its cache's changes
    (``PromptCache`` journal) in order: ``[0, id, row, length]`` stores row ``row``'s
    state cut to ``length`` tokens as entry ``id``, ``[1, id]`` drops entry ``id``,
    ``[2]`` drops every entry."""

    orders: tuple[int, ...]
    events: tuple[tuple[int, ...], ...] = ()


class Clear(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Rank 0 freed MLX's buffer cache (idle, or after a prompt-cache reset)."""


class Stop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Rank 0 is shutting down: followers end their loop and exit 0."""


Op = Admit | PrefillStep | DropJob | Join | Drop | Launch | ReadBack | Finish | Store | \
    Clear | Stop


class Message(msgspec.Struct, array_like=True, frozen=True):
    ops: tuple[Op, ...] = ()


class Agreement(msgspec.Struct, frozen=True, kw_only=True):
    """What every rank must share before serving (rank 0's, sent once after loading):
    the policy fields that shape plans and batches, and the engine's path and slots."""

    hold_groups: bool
    burst_chunks: int
    lazy_leave: bool
    prefill_align: int
    path: str
    parallel: int
    port: int  # rank 0's liveness listener (``liveness``)
    token: str
    hosts: tuple[str, ...]


_encoder = msgspec.msgpack.Encoder()
_message = msgspec.msgpack.Decoder(Message)
_agreement = msgspec.msgpack.Decoder(Agreement)


def encode(value: Message | Agreement) -> bytes:
    return _encoder.encode(value)


def decode_message(data: bytes) -> Message:
    return _message.decode(data)


def decode_agreement(data: bytes) -> Agreement:
    return _agreement.decode(data)
