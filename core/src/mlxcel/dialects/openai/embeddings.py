"""OpenAI's ``POST /v1/embeddings``: ``input`` (a string, strings, token ids or token-id
lists), ``encoding_format`` (float or base64), ``dimensions`` (Matryoshka truncation, then
re-normalized), ``usage``."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import numpy as np
from litestar import Request, post

from mlxcel.context import AppContext
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.wire import decode_body
from mlxcel.errors import InvalidRequest
from mlxcel.retrieval import embed as emb
from mlxcel.retrieval import side_model
from mlxcel.retrieval.vectors import check_dimensions, normalize, to_base64, truncate

FORMATS = ("float", "base64")


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    input: Any
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


def build(ctx: AppContext) -> list[Any]:
    @post("/v1/embeddings", status_code=200)
    async def embeddings(request: Request) -> dict[str, Any]:
        since = time.perf_counter()
        side = side_model(ctx, "embed", "/v1/embeddings")
        body = await decode_body(request, EmbeddingsRequest)
        if body.encoding_format not in FORMATS:
            raise InvalidRequest(f"'encoding_format' must be float or base64, not "
                                 f"{body.encoding_format!r}", param="encoding_format")
        runner = side.runner
        if runner.pooling == "none":
            raise InvalidRequest("--pooling none gives one vector per token, which the "
                                 "OpenAI shape has no room for; use POST /embeddings",
                                 param="input")
        check_dimensions(body.dimensions, runner.dimensions)
        items = emb.inputs_of(body.input)
        encoded = await prepare_for(request, lambda: emb.encode(runner, items))
        vectors = await emb.embed(side, encoded, runner.pooling, since)
        code = ctx.settings.embd_normalize  # one [inputs, D] matrix: a NumPy call each
        out = normalize(truncate(np.stack(vectors), body.dimensions, runner.dimensions), code)
        tokens = sum(len(e) for e in encoded)
        rows = [to_base64(v) for v in out] if body.encoding_format == "base64" \
            else out.tolist()
        return {"object": "list", "model": body.model or side.name,
                "data": [{"object": "embedding", "index": i, "embedding": row}
                         for i, row in enumerate(rows)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return [embeddings]
