"""Embedding requests: OpenAI's ``input`` shapes, each input tokenized and length-checked
on the HTTP side (naming the input that is refused), then one run on the job lane."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlxcel.engine.side import SideEngine
from mlxcel.errors import InvalidRequest
from mlxcel.families.tasks import Encoded
from mlxcel.retrieval.vectors import check_finite

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value)


def inputs_of(value: Any, param: str = "input") -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists, as
    a list of inputs (each a text or a token-id list)."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif _is_ids(value) and value:
        items = [value]
    elif isinstance(value, list) and value and (
            all(isinstance(x, str) for x in value) or all(_is_ids(x) for x in value)):
        items = value
    else:
        raise InvalidRequest(f"'{param}' must be a non-empty string, a list of strings, a "
                             "list of token ids or a list of token-id lists", param=param)
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'{param}' has {len(items)} inputs; at most {MAX_INPUTS} per "
                             "request", param=param)
    for i, item in enumerate(items):
        if len(item) == 0:
            raise InvalidRequest(f"{param}[{i}] is empty", param=f"{param}[{i}]")
    return items


def encode(runner: Any, items: list[str | list[int]], param: str = "input") -> list[Encoded]:
    """Each input as the model reads it; a token id outside the vocabulary or an input
    longer than the model takes is a 400 naming it."""
    out = []
    texts = [item for item in items if isinstance(item, str)]
    batch = getattr(runner, "tokenize_batch", None)  # optional (tasks.Embedder)
    ready = iter(batch(texts)) if batch is not None and len(texts) > 1 else None
    for i, item in enumerate(items):
        where = f"{param}[{i}]" if len(items) > 1 or not isinstance(item, str) else param
        if isinstance(item, str):
            enc = next(ready) if ready is not None else runner.tokenize(item)
        else:
            bad = next((t for t in item if not 0 <= t < runner.vocab_size), None)
            if bad is not None:
                raise InvalidRequest(f"{where}: token id {bad} is out of vocabulary range "
                                     f"(vocab_size {runner.vocab_size})", param=where)
            enc = Encoded(list(item))
        if len(enc) > runner.max_length:
            raise InvalidRequest(f"{where} has {len(enc)} tokens; the embedding model takes "
                                 f"at most {runner.max_length}", param=where)
        out.append(enc)
    return out


async def embed(side: SideEngine, encoded: list[Encoded], pooling: str,
                since: float | None = None) -> list[np.ndarray]:
    """The model's vectors (not yet normalized), one per input, in order; batched on the
    job lane with other requests of the same pooling. ``since``: the request's arrival."""
    runner = side.runner
    vectors = await side.run(encoded, ("embed", pooling),
                             lambda batch: runner.embed(batch, pooling), since)
    check_finite(vectors)
    return vectors
