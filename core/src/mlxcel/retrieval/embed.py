"""Embedding requests: OpenAI's ``input`` shapes and llama-server's, each input tokenized
and length-checked on the HTTP side (naming the input that is refused), then one run on
the job lane.

An input is a text, a list of token ids, or llama-server's two other forms: a "mixed"
list of token ids and texts (the texts tokenized without special tokens, in place), and
an object, ``{"prompt_string": text}`` or ``{"content": [text parts]}`` (an embedder takes
text only: any other part is refused). A request's ``input`` is one input, or a list of
them; a flat list of ids, or of ids and texts with at least one id, is one input, as
llama-server reads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlxcel.chat.request import one_prompt
from mlxcel.engine.side import SideEngine
from mlxcel.errors import InvalidRequest
from mlxcel.families.tasks import Encoded
from mlxcel.retrieval.vectors import check_finite

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

Input = str | list[int] | list[int | str]  # a text, token ids, or ids and texts mixed


def _one(value: Any, where: str) -> Input:
    if isinstance(value, dict):
        return _object(value, where)
    if isinstance(value, str) or value == [] or one_prompt(value):
        return value  # an empty list is refused once tokenized, naming it
    raise InvalidRequest(f"{where} must be a string, a list of token ids (and strings), or "
                         "an object with 'prompt_string' or 'content'", param=where)


def _object(value: dict[str, Any], where: str) -> str:
    """llama-server's prompt object: its text; media in it are refused (text only)."""
    if value.get("multimodal_data"):
        raise InvalidRequest(f"{where}.multimodal_data: this embedding model takes text "
                             "only", param=f"{where}.multimodal_data")
    if isinstance(value.get("prompt_string"), str):
        return value["prompt_string"]
    parts = value.get("content")
    if not isinstance(parts, list):
        raise InvalidRequest(f"{where} must have 'prompt_string' (a string) or 'content' "
                             "(a list of text parts)", param=where)
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text" or \
                not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{at}: this embedding model takes text parts only "
                                 "({'type': 'text', 'text': ...})", param=at)
        texts.append(part["text"])
    return "".join(texts)


def inputs_of(value: Any, param: str = "input") -> list[Input]:
    """``input`` as a list of inputs (module docstring)."""
    if isinstance(value, list) and not value:
        raise InvalidRequest(f"'{param}' must not be empty", param=param)
    if one_prompt(value):
        items = [_one(value, param)]
    elif isinstance(value, list):
        items = [_one(x, f"{param}[{i}]") for i, x in enumerate(value)]
    else:
        raise InvalidRequest(f"'{param}' must be a string, a list of strings, a list of "
                             "token ids or a list of token-id lists", param=param)
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'{param}' has {len(items)} inputs; at most {MAX_INPUTS} per "
                             "request", param=param)
    return items


def _ids(runner: Any, item: list[int | str], where: str) -> list[int]:
    """A list of ids, or of ids and texts (each text its tokens without special tokens:
    the runner's optional ``tokenize_piece``, else its ``tokenize``), checked against the
    vocabulary."""
    piece = getattr(runner, "tokenize_piece", None)
    out: list[int] = []
    for x in item:
        if isinstance(x, str):
            out += piece(x) if piece is not None else runner.tokenize(x).ids
        elif not 0 <= x < runner.vocab_size:
            raise InvalidRequest(f"{where}: token id {x} is out of vocabulary range "
                                 f"(vocab_size {runner.vocab_size})", param=where)
        else:
            out.append(x)
    return out


def encode(runner: Any, items: list[Input], param: str = "input") -> list[Encoded]:
    """Each input as the model reads it; a token id outside the vocabulary, an input of no
    tokens or one longer than the model takes is a 400 naming it."""
    out = []
    texts = [item for item in items if isinstance(item, str)]
    batch = getattr(runner, "tokenize_batch", None)  # optional (tasks.Embedder)
    ready = iter(batch(texts)) if batch is not None and len(texts) > 1 else None
    for i, item in enumerate(items):
        where = f"{param}[{i}]" if len(items) > 1 or not isinstance(item, str) else param
        if isinstance(item, str):
            enc = next(ready) if ready is not None else runner.tokenize(item)
        else:
            enc = Encoded(_ids(runner, item, where))
        if len(enc) == 0:
            raise InvalidRequest(f"{where} is empty: it has no tokens", param=where)
        if len(enc) > runner.max_length:
            raise InvalidRequest(f"{where} is too large: {len(enc)} tokens, and the "
                                 f"embedding model takes at most {runner.max_length}",
                                 param=where)
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
