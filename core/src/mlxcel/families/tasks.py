"""What a family's task runners are: the objects core calls for each task but ``generate``.

A family names one ``"module:attr"`` per task in ``Family.tasks``. For a side task the
attr is a factory ``make(loaded, options) -> runner``, called once on the engine thread
after ``load``; core then drives the runner through the engine's job lane:

- ``tokenize``/``encode_pair`` run on the HTTP side, never touch MLX, and are cheap, so a
  request is checked (length, count) before it waits for the model;
- ``embed``/``score`` run on the engine thread only (``EngineClient.call``), each with a
  batch that may hold the inputs of several requests, so they must not keep per-request
  state.

A runner may queue a batch on the device and return ``Later(read)`` instead of its results:
the lane then builds and queues the next batch before ``read()`` waits for this one, so
the device never idles while the engine thread builds a graph (``mlxcel.engine.lanes``).

Rows of a batch have different lengths: a runner pads them itself (with its attention
mask), since only it knows its pad id and what padding means to its pooling. The speech
tasks' runners (``transcribe``, ``speak``) are in ``mlxcel.families.speech``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

TASKS = ("generate", "embed", "rerank", "transcribe", "speak", "generate_image", "realtime")
POOLINGS = ("mean", "cls", "last", "rank", "none")


class Later:
    """A batch queued on the device (``mx.async_eval``): ``read()`` waits for it and returns
    its results, one per item, as the runner's method would have. Engine thread only; the
    lane calls ``read`` once."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], list[Any]]) -> None:
        self.read = read


def resolved(value: list[Any] | Later) -> list[Any]:
    """A runner call's results: a ``Later``'s, read now, or the list itself (for callers
    outside the lane: conformance runners, tests)."""
    return value.read() if isinstance(value, Later) else value


class TaskOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the server wants a side task served. ``pooling``: ``--pooling`` (None: the
    checkpoint's own, from its sentence-transformers config); ``max_length``:
    ``--embedding-max-length`` (0: the model's)."""

    pooling: str | None = None
    max_length: int = 0


class Encoded(msgspec.Struct, frozen=True):
    """One model input: token ids, and token type ids where the model reads them (a BERT
    cross-encoder's pair)."""

    ids: list[int]
    type_ids: list[int] | None = None

    def __len__(self) -> int:
        return len(self.ids)


class Embedder(Protocol):
    """The ``embed`` task's runner.

    ``dimensions``: the length of a pooled vector. ``max_length``: the most tokens one
    input may have (longer ones are refused by core, naming the input). ``pooling``: the
    pooling it runs (``--pooling``, else the checkpoint's). ``vocab_size``: token ids a
    request may send as input are below it.

    Optional: ``tokenize_batch(texts) -> list[Encoded]``, the same as ``tokenize`` on each
    text, in order. Where a runner has it, core calls it for a request's texts at once:
    a Rust tokenizer's batch call encodes them in parallel without holding the GIL, which
    the engine thread needs for its forwards while the HTTP side takes requests in.
    ``tokenize_piece(text) -> list[int]``: ``text``'s ids without special tokens, for the
    texts inside llama-server's mixed prompts (ids and texts in one list); without it
    core takes ``tokenize``'s ids there.
    """

    dimensions: int
    max_length: int
    pooling: str
    vocab_size: int

    def tokenize(self, text: str) -> Encoded:
        """``text`` as the model reads it, its special tokens included. HTTP side."""
        ...

    def embed(self, inputs: Sequence[Encoded], pooling: str) -> list[Any] | Later:
        """One float32 NumPy array per input, in order: ``[dimensions]`` pooled, or
        ``[tokens, dimensions]`` for ``pooling == "none"`` (or a ``Later`` reading them).
        Not normalized: core applies ``--embd-normalize`` and ``dimensions`` truncation.
        Engine thread."""
        ...


class Reranker(Protocol):
    """The ``rerank`` task's runner. ``max_length``: the most tokens one (query,
    document) pair may have once encoded."""

    max_length: int

    def encode_pair(self, query: str, document: str) -> Encoded:
        """The pair as the model reads it (a cross-encoder's ``[CLS] q [SEP] d [SEP]`` with
        type ids, or a generative reranker's prompt). HTTP side."""
        ...

    def score(self, pairs: Sequence[Encoded]) -> list[float] | Later:
        """One relevance score in [0, 1] per pair, in order (or a ``Later`` reading
        them). Engine thread."""
        ...
