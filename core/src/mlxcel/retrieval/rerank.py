"""Rerank requests: a query and documents (Jina/Cohere) or texts (TEI), each pair encoded
and length-checked on the HTTP side, scored on the job lane, sorted and cut to ``top_n``."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from mlxcel.engine.side import SideEngine
from mlxcel.errors import InvalidRequest, ServerError
from mlxcel.families.tasks import Encoded
from mlxcel.retrieval.embed import MAX_INPUTS


class Ranked(msgspec.Struct, frozen=True):
    index: int
    score: float
    text: str


def texts_of(value: Any, param: str) -> list[str]:
    """Documents as strings: each a string or an object with a ``text`` string."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'{param}' must be a non-empty list", param=param)
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"'{param}' has {len(value)} documents; at most {MAX_INPUTS}",
                             param=param)
    out = []
    for i, doc in enumerate(value):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise InvalidRequest(f"{param}[{i}] must be a string or an object with a 'text' "
                                 "string", param=f"{param}[{i}]")
        out.append(text)
    return out


def check_top_n(top_n: int | None) -> None:
    if top_n is not None and top_n < 1:
        raise InvalidRequest(f"'top_n' must be at least 1, not {top_n}", param="top_n")


def check_query(query: Any) -> str:
    if not isinstance(query, str) or not query:
        raise InvalidRequest("'query' must be a non-empty string", param="query")
    return query


def encode_pairs(runner: Any, query: str, texts: list[str], param: str) -> list[Encoded]:
    """Each (query, document) pair as the reranker reads it; a pair longer than the model
    takes is a 400 naming its document. HTTP side, off the event loop."""
    pairs = []
    for i, text in enumerate(texts):
        pair = runner.encode_pair(query, text)
        if len(pair) > runner.max_length:
            raise InvalidRequest(f"{param}[{i}] with the query is too large: {len(pair)} "
                                 f"tokens, and the reranker takes at most {runner.max_length}",
                                 param=f"{param}[{i}]")
        pairs.append(pair)
    return pairs


async def rank(side: SideEngine, pairs: list[Encoded], texts: list[str],
               top_n: int | None, since: float | None = None) -> tuple[list[Ranked], int]:
    """The documents by score (highest first), at most ``top_n``, and the tokens read.
    ``since``: the request's arrival (``perf_counter``)."""
    scores = await side.run(pairs, ("rerank",), side.runner.score, since)
    if not all(math.isfinite(s) for s in scores):  # the model's failure, never the client's
        raise ServerError("the reranking model produced a non-finite score")
    ranked = sorted((Ranked(i, float(s), texts[i]) for i, s in enumerate(scores)),
                    key=lambda r: (-r.score, r.index))
    return ranked[:top_n] if top_n else ranked, sum(len(p) for p in pairs)
