"""The family served by the real app: an embedder alone (``-m``), side models beside a chat
model in one process, a generative reranker through ``--reranker-model``, the CLI's
pre-fork checks, and chat streams that keep going while embeddings run."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from mlxcel.cli import main as cli_main
from mlxcel.families.api import LoadOptions
from mlxcel.families.tasks import TaskOptions, resolved
from mlxcel.testing.engine import app_client
from mlxcel_family_embeddings.load import load
from mlxcel_family_embeddings.runners import embedder

TEXTS = ["a river runs past the quiet stone", "lantern"]


@pytest.fixture(scope="module")
def bert(side_checkpoint):
    return side_checkpoint("embedder", kind="bert")


def test_an_embedder_alone_serves_the_model_s_normalized_vectors(bert):
    runner = embedder(load(bert, LoadOptions(dtype="float32")), TaskOptions())
    want = resolved(runner.embed([runner.tokenize(t) for t in TEXTS], "mean"))
    with app_client(bert) as c:
        body = c.post("/v1/embeddings", json={"input": TEXTS}).json()
        health = c.get("/health").json()
        chat = c.post("/v1/chat/completions", json={"messages": []})
    for d, v in zip(body["data"], want, strict=True):
        assert np.allclose(d["embedding"], v / np.linalg.norm(v), atol=1e-5)
    assert health["capabilities"] == ["embedding"]
    assert chat.status_code == 501 and "/v1/embeddings" in chat.json()["error"]["message"]


def test_chat_embedder_and_generative_reranker_in_one_process(tiny_checkpoint, bert,
                                                            side_checkpoint):
    qwen_rr = side_checkpoint("reranker", kind="qwen3")
    with app_client(tiny_checkpoint, embedding_model=str(bert),
                    reranker_model=str(qwen_rr)) as c:
        models = {m["id"]: m["capabilities"] for m in c.get("/v1/models").json()["data"]}
        assert sorted(models.values()) == [["completion"], ["embedding"], ["rerank"]]
        assert c.get("/health").json()["capabilities"] == ["completion", "embedding",
                                                           "rerank"]
        done: list[int] = []

        def flood() -> None:
            for i in range(6):
                done.append(c.post("/v1/embeddings",
                                   json={"input": [f"{t} {i}" for t in TEXTS * 4]}).status_code)

        thread = threading.Thread(target=flood)
        thread.start()
        chat = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24,
            "ignore_eos": True})
        thread.join(60)
        ranked = c.post("/v1/rerank", json={"query": "which river", "documents": TEXTS})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 24
    assert done == [200] * 6
    assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2


def test_the_cli_refuses_a_chat_checkpoint_as_an_embedder(tiny_checkpoint, capsys):
    code = cli_main(["-m", str(tiny_checkpoint), "--embeddings", "--port", "1"])
    err = capsys.readouterr().err
    assert code != 0 and "embed" in err and "chat model" in err and "\n" == err[-1]
    assert err.count("\n") == 1


def test_the_pre_fork_checks_import_no_mlx(tiny_checkpoint, bert):
    """The CLI checks -m and the side models before Granian forks: MLX must not be
    imported then (a device initialised before the fork is unusable on CUDA)."""
    import subprocess
    import sys

    code = ("import sys; from mlxcel.cli import _prepare_model; "
            "from mlxcel.settings import Settings; "
            f"s = _prepare_model(Settings(model={str(tiny_checkpoint)!r}, "
            f"embedding_model={str(bert)!r})); "
            f"_prepare_model(Settings(model={str(bert)!r})); "
            "print(s.embedding_model, [m for m in ('mlx', 'mlx_lm', 'mlx_vlm') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == f"{bert} []"


def test_plugins_model_names_an_embedder_s_task_and_family(bert, capsys):
    assert cli_main(["plugins", "--model", str(bert)]) == 0
    assert f"{bert}: task embed (family embeddings)" in capsys.readouterr().out
