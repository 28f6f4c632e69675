"""llama-server's native side-model routes: ``POST /embedding`` and ``/embeddings`` (a bare
array of ``{index, embedding}``, ``embedding`` an array of rows: one pooled row, or one row
per token with ``--pooling none``), and the rerank routes ``/rerank``, ``/reranking``,
``/v1/rerank``, ``/v1/reranking``: Jina/Cohere's shape for ``documents``, TEI's array for
``texts``."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, post

from mlxcel.context import AppContext
from mlxcel.dialects.prepare import prepare_for
from mlxcel.dialects.wire import decode_body
from mlxcel.errors import InvalidRequest
from mlxcel.retrieval import embed as emb
from mlxcel.retrieval import rerank as rr
from mlxcel.retrieval import side_model
from mlxcel.retrieval.vectors import normalize

RERANK_PATHS = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    content: Any = None
    input: Any = None
    embd_normalize: int | None = None


class RerankRequest(msgspec.Struct, kw_only=True):
    query: Any = None
    documents: Any = None
    texts: Any = None
    top_n: int | None = None
    return_documents: bool = False
    return_text: bool = False
    model: str | None = None


def build(ctx: AppContext) -> list[Any]:
    @post(["/embedding", "/embeddings"], status_code=200)
    async def embedding(request: Request) -> Response:
        since = time.perf_counter()
        side = side_model(ctx, "embed", request.url.path)
        body = await decode_body(request, EmbeddingRequest)
        if body.content is None and body.input is None:
            raise InvalidRequest("'content' (or 'input') is required", param="content")
        param = "content" if body.content is not None else "input"
        items = emb.inputs_of(body.content if body.content is not None else body.input, param)
        runner = side.runner
        encoded = await prepare_for(request, lambda: emb.encode(runner, items, param))
        vectors = await emb.embed(side, encoded, runner.pooling, since)
        code = ctx.settings.embd_normalize if body.embd_normalize is None \
            else body.embd_normalize
        rows = [v.tolist() if runner.pooling == "none"  # per token: as the model gave them
                else [normalize(v, code).tolist()] for v in vectors]
        return Response([{"index": i, "embedding": r} for i, r in enumerate(rows)])

    @post(RERANK_PATHS, status_code=200)
    async def rerank(request: Request) -> Response:
        since = time.perf_counter()
        side = side_model(ctx, "rerank", request.url.path)
        body = await decode_body(request, RerankRequest)
        tei = body.documents is None and body.texts is not None
        if body.documents is None and body.texts is None:
            raise InvalidRequest("'documents' (or TEI's 'texts') is required",
                                 param="documents")
        param = "texts" if tei else "documents"
        texts = rr.texts_of(body.texts if tei else body.documents, param)
        query = rr.check_query(body.query)
        rr.check_top_n(body.top_n)
        runner = side.runner
        pairs = await prepare_for(request, lambda: rr.encode_pairs(runner, query, texts, param))
        ranked, tokens = await rr.rank(side, pairs, texts, body.top_n, since)
        if tei:
            return Response([{"index": r.index, "score": r.score,
                              **({"text": r.text} if body.return_text else {})}
                             for r in ranked])
        return Response({
            "model": body.model or side.name, "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": [{"index": r.index, "relevance_score": r.score,
                         **({"document": {"text": r.text}} if body.return_documents else {})}
                        for r in ranked]})

    return [embedding, rerank]
