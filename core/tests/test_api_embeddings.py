"""The embedding and rerank routes over the job lane, with a NumPy stand-in for the model
(core has no embedding family): wire shapes, normalization and ``dimensions`` against a
NumPy reference, base64, batching across concurrent requests, 503 on a full queue, 504 on a
timeout, and 501 in every dialect without the model."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import LaneLimits
from mlxcel.engine.side import SideEngine
from mlxcel.engines import Engines
from mlxcel.families.tasks import Encoded
from mlxcel.settings import Settings

DIM, VOCAB = 8, 50
TABLE = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)


class NumpyEmbedder:
    """A stand-in model: a token is a word's hash; a text's vector the mean of its
    tokens' rows of ``TABLE``."""

    dimensions, max_length, pooling, vocab_size = DIM, 16, "mean", VOCAB

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        self.batches: list[int] = []
        self.delay, self.gate = delay, gate

    def tokenize(self, text: str) -> Encoded:
        return Encoded([sum(map(ord, w)) % VOCAB for w in text.split()])

    def embed(self, inputs: list[Encoded], pooling: str) -> list[np.ndarray]:
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(self.delay)
        self.batches.append(len(inputs))
        rows = [TABLE[e.ids] for e in inputs]
        return [r if pooling == "none" else r.mean(axis=0) for r in rows]


class NumpyReranker:
    max_length = 32

    def encode_pair(self, query: str, document: str) -> Encoded:
        return Encoded([len(w) % VOCAB for w in f"{query} {document}".split()])

    def score(self, pairs: list[Encoded]) -> list[float]:
        return [1 / (1 + np.exp(-(len(p) - 4))) for p in pairs]


def reference(text: str) -> np.ndarray:
    ids = [sum(map(ord, w)) % VOCAB for w in text.split()]
    v = TABLE[ids].astype(np.float64).mean(axis=0)
    return v / np.linalg.norm(v)


@contextmanager
def side_app(embedder: Any = None, reranker: Any = None, limits: LaneLimits | None = None,
             **settings: Any) -> Iterator[TestClient]:
    worker = LaneWorker([])
    sides = {task: SideEngine(task, name, lambda r=runner: r, worker.client(),
                              limits or LaneLimits(batch_items=16))
             for task, name, runner in (("embed", "emb", embedder),
                                        ("rerank", "rr", reranker)) if runner is not None}
    worker.sides = list(sides.values())
    app = create_app(Settings(alias="side", **settings),
                     engines=Engines(None, sides, worker))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert worker.ready.wait(10)
        yield client


def test_openai_embeddings_shape_usage_and_normalized_vectors():
    with side_app(NumpyEmbedder()) as c:
        r = c.post("/v1/embeddings", json={"input": ["river stone", "quiet lantern orbit"],
                                           "model": "m"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "m"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    for d, text in zip(body["data"], ["river stone", "quiet lantern orbit"], strict=True):
        assert np.allclose(d["embedding"], reference(text), atol=1e-6)


def test_base64_dimensions_and_token_id_inputs():
    with side_app(NumpyEmbedder()) as c:
        r = c.post("/v1/embeddings", json={"input": "river stone", "dimensions": 3,
                                           "encoding_format": "base64"})
        ids = c.post("/v1/embeddings", json={"input": [[1, 2], [3]]})
        bad = c.post("/v1/embeddings", json={"input": [[1, VOCAB]]})
        big = c.post("/v1/embeddings", json={"input": "x", "dimensions": DIM + 1})
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
    full = reference("river stone") * np.linalg.norm(TABLE[[sum(map(ord, w)) % VOCAB for w in
                                                           ("river", "stone")]].mean(0))
    expect = full[:3] / np.linalg.norm(full[:3])  # truncated, then re-normalized
    assert vec.shape == (3,) and np.allclose(vec, expect, atol=1e-6)
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 3
    first = TABLE[[1, 2]].mean(axis=0)
    assert np.allclose(ids.json()["data"][0]["embedding"], first / np.linalg.norm(first),
                       atol=1e-6)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0]"
    assert big.status_code == 400 and big.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [1, True]}, "input[0]"),
    ({"input": "w " * 17}, "input"), ({"input": ["a", "w " * 17]}, "input[1]"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"), ({}, "input"),
])
def test_bad_embedding_requests_are_400_naming_the_field(body, param):
    with side_app(NumpyEmbedder()) as c:
        r = c.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["param"] == param


def test_llama_server_native_embedding_shape_and_normalize_codes():
    with side_app(NumpyEmbedder(), embd_normalize=1) as c:
        native = c.post("/embedding", json={"content": ["river stone"]}).json()
        plain = c.post("/embeddings", json={"content": "river", "embd_normalize": -1}).json()
    v = TABLE[[sum(map(ord, w)) % VOCAB for w in ("river", "stone")]].mean(0)
    assert native[0]["index"] == 0 and len(native[0]["embedding"]) == 1
    assert np.allclose(native[0]["embedding"][0], v / np.abs(v).sum(), atol=1e-6)  # taxicab
    assert np.allclose(plain[0]["embedding"][0], TABLE[sum(map(ord, "river")) % VOCAB],
                       atol=1e-6)


def test_pooling_none_gives_a_row_per_token_natively_and_a_400_on_openai():
    runner = NumpyEmbedder()
    runner.pooling = "none"
    with side_app(runner) as c:
        native = c.post("/embedding", json={"content": "river stone lantern"}).json()
        oai = c.post("/v1/embeddings", json={"input": "river"})
    assert len(native[0]["embedding"]) == 3 and len(native[0]["embedding"][0]) == DIM
    assert oai.status_code == 400


def test_concurrent_requests_share_one_forward():
    gate = threading.Event()
    runner = NumpyEmbedder(gate=gate)
    with side_app(runner) as c:
        results: list[int] = []

        def call(i: int) -> None:
            r = c.post("/v1/embeddings", json={"input": [f"w{i} a", f"w{i} b"]})
            results.append(r.status_code)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the first batch holds the lane; the others queue behind it
        gate.set()
        for t in threads:
            t.join(10)
    assert results == [200] * 4
    assert sum(runner.batches) == 8 and len(runner.batches) < 4 and max(runner.batches) > 2


def test_a_full_queue_is_503_and_a_slow_job_504():
    gate = threading.Event()
    with side_app(NumpyEmbedder(gate=gate),
                  limits=LaneLimits(depth=1, timeout_s=0.5, batch_items=4)) as c:
        first: list[Any] = []
        t = threading.Thread(target=lambda: first.append(
            c.post("/v1/embeddings", json={"input": "a"})))
        t.start()
        time.sleep(0.15)
        busy = c.post("/v1/embeddings", json={"input": "b"})
        t.join(10)
        gate.set()
    assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_busy"
    assert first[0].status_code == 504 and first[0].json()["error"]["type"] == "timeout_error"


def test_rerank_jina_and_tei_shapes_sorted_and_cut():
    with side_app(reranker=NumpyReranker()) as c:
        docs = ["one", "two words here now", "three words here"]
        jina = c.post("/v1/rerank", json={"query": "q", "documents": docs, "top_n": 2,
                                          "return_documents": True}).json()
        tei = c.post("/rerank", json={"query": "q", "texts": docs, "return_text": True}).json()
        zero = c.post("/reranking", json={"query": "q", "documents": docs, "top_n": 0})
        long = c.post("/v1/reranking", json={"query": "q", "documents": ["w " * 40]})
    assert jina["object"] == "list" and [r["index"] for r in jina["results"]] == [1, 2]
    assert jina["results"][0]["document"] == {"text": docs[1]}
    scores = [r["relevance_score"] for r in jina["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert jina["usage"]["prompt_tokens"] == 2 + 5 + 4
    assert [r["index"] for r in tei] == [1, 2, 0] and tei[2]["text"] == "one"
    assert zero.status_code == 400 and zero.json()["error"]["param"] == "top_n"
    assert long.status_code == 400 and long.json()["error"]["param"] == "documents[0]"


@pytest.mark.parametrize("path,dialect", [
    ("/v1/chat/completions", "openai"), ("/v1/completions", "openai"),
    ("/v1/messages", "anthropic"), ("/v1/responses", "openai"), ("/completion", "openai"),
    ("/infill", "openai"), ("/tokenize", "openai")])
def test_generation_routes_are_501_in_their_dialect_without_a_chat_model(path, dialect):
    with side_app(NumpyEmbedder()) as c:
        r = c.post(path, json={"model": "m", "messages": [], "prompt": "x", "input": "x",
                               "max_tokens": 1})
        health = c.get("/health").json()
        models = c.get("/v1/models").json()["data"]
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    if dialect == "anthropic":
        assert r.json()["type"] == "error"
    else:
        assert err["type"] == "not_implemented"
    assert "/v1/embeddings" in err["message"] and "/v1/chat/completions" not in err["message"]
    assert health["status"] == "ok" and health["capabilities"] == ["embedding"]
    assert models == [{"id": "emb", "object": "model", "created": models[0]["created"],
                       "owned_by": "user", "capabilities": ["embedding"], "tags": []}]


@pytest.mark.parametrize("path,flag", [
    ("/v1/embeddings", "--embedding-model"), ("/embedding", "--embedding-model"),
    ("/v1/rerank", "--reranker-model"), ("/reranking", "--reranker-model")])
def test_side_routes_without_their_model_are_501_naming_the_flag(path, flag):
    with side_app(reranker=NumpyReranker()) if "embed" in path else \
            side_app(NumpyEmbedder()) as c:
        r = c.post(path, json={"input": "x", "query": "q", "documents": ["d"]})
    assert r.status_code == 501
    message = r.json()["error"]["message"]
    assert flag in message and "mlxcel-family-embeddings" in message


def test_a_non_finite_vector_is_a_500_not_a_broken_json():
    class NanEmbedder(NumpyEmbedder):
        def embed(self, inputs, pooling):
            return [np.full(DIM, np.nan, dtype=np.float32) for _ in inputs]

    with side_app(NanEmbedder()) as c:
        r = c.post("/v1/embeddings", json={"input": "river"})
        native = c.post("/embedding", json={"content": "river"})
    for resp in (r, native):
        assert resp.status_code == 500
        assert resp.json()["error"]["type"] == "server_error"
        assert "non-finite" in resp.json()["error"]["message"]
