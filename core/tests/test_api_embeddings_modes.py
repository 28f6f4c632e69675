"""Serving modes around the side models: the flags and their env twins, ``--embeddings`` /
``--reranking`` dropping the chat model, every generation route a 501 in its dialect's shape
in a side-only process, ``/health`` while a side model loads or after it failed, and a chat
model with an embedder beside it listed with each model's capabilities, and requests
refused by their fields before the model runs; a non-finite rerank score is a 500."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.context import TASK_ROUTES
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import LaneLimits
from mlxcel.engine.side import SideEngine
from mlxcel.engines import Engines, build_engines, lane_limits, plan_models
from mlxcel.options import build_parser
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings
from mlxcel.testing.engine import wait_ready
from test_api_embeddings import DIM, NumpyEmbedder, NumpyReranker, side_app

ANTHROPIC = ("/v1/messages", "/messages", "/v1/messages/count_tokens", "/messages/count_tokens")
SIDE_PATHS = {p for task in ("embed", "rerank") for p in TASK_ROUTES[task]}


@pytest.mark.parametrize("env,dest,value", [
    ({"LLAMA_ARG_EMBEDDING_MODEL": "e"}, "embedding_model", "e"),
    ({"MLXCEL_EMBEDDING_MODEL": "e2"}, "embedding_model", "e2"),
    ({"LLAMA_ARG_RERANKER_MODEL": "r"}, "reranker_model", "r"),
    ({"MLXCEL_RERANKER_MODEL": "r2"}, "reranker_model", "r2"),
    ({"LLAMA_ARG_EMBEDDINGS": "1"}, "embeddings", True),
    ({"LLAMA_ARG_RERANKING": "true"}, "reranking", True),
    ({"LLAMA_ARG_POOLING": "cls"}, "pooling", "cls"),
    ({"MLXCEL_EMBEDDING_POOLING": "last"}, "pooling", "last"),
    ({"MLXCEL_EMBD_NORMALIZE": "-1"}, "embd_normalize", -1),
    ({"MLXCEL_EMBEDDING_BATCH_SIZE": "4"}, "embedding_batch_size", 4),
    ({"MLXCEL_EMBEDDING_MAX_LENGTH": "128"}, "embedding_max_length", 128),
    ({"MLXCEL_EMBEDDING_QUEUE_DEPTH": "2"}, "embedding_queue_depth", 2),
    ({"MLXCEL_EMBEDDING_REQUEST_TIMEOUT_SECS": "1.5"}, "embedding_request_timeout_secs", 1.5),
    ({"MLXCEL_RERANK_BATCH_SIZE": "3"}, "rerank_batch_size", 3),
])
def test_every_side_model_flag_has_its_env_twin(monkeypatch, env, dest, value):
    for name, text in env.items():
        monkeypatch.setenv(name, text)
    assert getattr(build_parser().parse_args([]), dest) == value


def test_side_model_flags_parse_into_settings_and_lane_limits():
    args = build_parser().parse_args([
        "--embedding-model", "e", "--reranker-model", "r", "--rerank", "--pooling", "none",
        "--embd-normalize", "3", "--embedding-batch-size", "5", "--embedding-max-length",
        "64", "--embedding-queue-depth", "2", "--embedding-request-timeout-secs", "9",
        "--rerank-batch-size", "7"])
    settings = Settings(**vars(args))
    assert (settings.embedding_model, settings.reranker_model, settings.reranking,
            settings.embeddings, settings.pooling, settings.embd_normalize,
            settings.embedding_max_length) == ("e", "r", True, False, "none", 3, 64)
    assert lane_limits(settings, "embed") == LaneLimits(depth=2, timeout_s=9.0, batch_items=5)
    assert lane_limits(settings, "rerank") == LaneLimits(depth=2, timeout_s=9.0, batch_items=7)
    assert build_parser().parse_args(["--embd-normalize", "-1"]).embd_normalize == -1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--pooling", "max"])


@pytest.mark.parametrize("settings,plan", [
    ({"model": "m", "embeddings": True}, (None, {"embed": "m"})),
    ({"model": "m", "reranking": True}, (None, {"rerank": "m"})),
    ({"model": "m", "embeddings": True, "embedding_model": "e", "reranker_model": "r"},
     (None, {"embed": "e"})),
    ({"model": "m", "embeddings": True, "reranking": True, "reranker_model": "r"},
     (None, {"embed": "m", "rerank": "r"})),
])
def test_a_mode_flag_serves_only_its_task_and_no_chat_model(settings, plan):
    assert plan_models(Settings(**settings), None) == plan


def _generation_posts(client: TestClient) -> list[str]:
    """Every POST path of the app, less the side routes and the stores (which answer on
    their own: a conversation is data, not a generation)."""
    paths = {r.path for r in client.app.routes
             if any("POST" in h.http_methods for h in r.route_handlers)}
    return sorted(p for p in paths - SIDE_PATHS
                  if "conversations" not in p and "{" not in p and "audio" not in p
                  and "images" not in p)


def test_every_generation_route_is_501_in_its_dialect_naming_the_routes_served():
    with side_app(reranker=NumpyReranker()) as c:
        paths = _generation_posts(c)
        answers = {p: c.post(p, json={"model": "m", "messages": [{"role": "user",
                                                                  "content": "hi"}],
                                      "prompt": "x", "input": "x", "content": "x",
                                      "tokens": [1], "max_tokens": 1}) for p in paths}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/completion",
            "/infill", "/tokenize", "/detokenize", "/apply-template"} <= set(paths)
    assert set(ANTHROPIC) <= set(paths)
    for path, r in answers.items():
        assert r.status_code == 501, (path, r.text)
        body = r.json()
        if path in ANTHROPIC:
            assert body["type"] == "error" and body["error"]["type"] == "api_error"
        else:
            assert body["error"]["type"] == "not_implemented", path
        message = body["error"]["message"]
        assert "/v1/rerank" in message and "/v1/embeddings" not in message, (path, message)


def test_a_reranking_only_server_reports_rerank_and_refuses_embeddings():
    with side_app(reranker=NumpyReranker()) as c:
        health, props = c.get("/health").json(), c.get("/props").json()
        models = c.get("/v1/models").json()["data"]
        emb = c.post("/v1/embeddings", json={"input": "x"})
        native = c.post("/embeddings", json={"content": "x"})
    assert health["capabilities"] == ["rerank"] and props["capabilities"] == ["rerank"]
    assert props["rerank_model"] == "rr" and props["total_slots"] == 0
    assert [(m["id"], m["capabilities"]) for m in models] == [("rr", ["rerank"])]
    for r in (emb, native):
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_implemented"
        assert "--embedding-model" in r.json()["error"]["message"]
        assert "/rerank" in r.json()["error"]["message"]


@contextmanager
def loading_app(load: Any) -> Iterator[TestClient]:
    worker = LaneWorker([])
    side = SideEngine("embed", "emb", load, worker.client(), LaneLimits())
    worker.sides = [side]
    app = create_app(Settings(alias="side"), engines=Engines(None, {"embed": side}, worker))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_health_is_503_while_the_side_model_loads_then_ok():
    gate = threading.Event()

    def load() -> NumpyEmbedder:
        gate.wait(10)
        return NumpyEmbedder()

    with loading_app(load) as c:
        loading = c.get("/health")
        early = c.post("/v1/embeddings", json={"input": "x"})
        gate.set()
        wait_ready(c, 10)
        ready = c.get("/health")
    assert loading.status_code == 503 and loading.json()["status"] == "loading model"
    assert early.status_code == 503 and early.json()["error"]["type"] == "server_busy"
    assert ready.status_code == 200 and ready.json()["models"] == [{"id": "emb",
                                                                    "task": "embed"}]


def test_health_is_503_naming_the_side_model_that_failed_to_load():
    def load() -> None:
        raise OSError("no weights here")

    with loading_app(load) as c:
        c.app.state["engines"].lane_worker.ready.wait(10)
        health = c.get("/health")
        emb = c.post("/v1/embeddings", json={"input": "x"})
    assert health.status_code == 503 and health.json()["status"] == "error"
    assert "no weights here" in health.json()["error"]
    assert emb.status_code == 500 and "no weights here" in emb.json()["error"]["message"]


@pytest.fixture(scope="module")
def chat_and_embedder(tiny_checkpoint) -> Iterator[TestClient]:
    settings = Settings(model=str(tiny_checkpoint), alias="tiny")
    plugins = load_plugins(settings.plugins, settings.disable_plugins)
    engines = build_engines(settings, plugins)
    side = SideEngine("embed", "emb", NumpyEmbedder, engines.chat.lanes, LaneLimits())
    engines.sides["embed"] = side
    engines.chat.worker.sides = [side]
    with TestClient(create_app(settings, plugins, engines=engines),
                    raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


def test_a_chat_model_and_an_embedder_side_by_side_each_with_its_capabilities(
        chat_and_embedder):
    c = chat_and_embedder
    models = c.get("/v1/models").json()["data"]
    health, props = c.get("/health").json(), c.get("/props").json()
    assert [(m["id"], m["capabilities"]) for m in models] == [("tiny", ["completion"]),
                                                             ("emb", ["embedding"])]
    assert health["capabilities"] == ["completion", "embedding"]
    assert props["capabilities"] == ["completion", "embedding"]
    emb = c.post("/v1/embeddings", json={"input": ["river stone", "lantern"]})
    chat = c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    rerank = c.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert emb.status_code == 200 and len(emb.json()["data"]) == 2
    assert chat.status_code == 200, chat.text
    assert rerank.status_code == 501 and "--reranker-model" in rerank.json()["error"]["message"]
    assert "/v1/chat/completions" in rerank.json()["error"]["message"]


def test_requests_refused_by_their_fields_never_reach_the_model():
    runner = NumpyEmbedder()
    with side_app(runner) as c:
        big = c.post("/v1/embeddings", json={"input": "x", "dimensions": DIM + 1})
        small = c.post("/v1/embeddings", json={"input": "x", "dimensions": 0})
        native = c.post("/embedding", json={})
        long = c.post("/embeddings", json={"content": ["a", "w " * 17]})
    assert [r.json()["error"]["param"] for r in (big, small, native, long)] == [
        "dimensions", "dimensions", "content", "content[1]"]
    assert all(r.status_code == 400 for r in (big, small, native, long))
    assert runner.batches == []


def test_a_non_finite_rerank_score_is_a_500():
    class NanReranker(NumpyReranker):
        def score(self, pairs):
            return [float("nan")] * len(pairs)

    with side_app(reranker=NanReranker()) as c:
        jina = c.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
        tei = c.post("/rerank", json={"query": "q", "texts": ["a"]})
    for r in (jina, tei):
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "non-finite" in r.json()["error"]["message"]
