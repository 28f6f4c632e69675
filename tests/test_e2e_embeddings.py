"""End to end: the real mlxcel-server process serving an embedder (``-m``) and a reranker
(``--reranker-model``) through mlxcel-family-embeddings, with the real openai SDK as the
client (whose ``embeddings.create`` asks for base64 unless told otherwise), and the 501s a
chat client gets from a server with no chat model, in the OpenAI and Anthropic SDKs'
own error types."""

from __future__ import annotations

import anthropic
import numpy as np
import openai
import pytest
from mlxcel.testing.servers import MlxcelServer

pytestmark = pytest.mark.slow
KEY = "k-emb"


@pytest.fixture(scope="module")
def server(side_checkpoint):
    embedder = side_checkpoint("embedder", kind="qwen3")
    ranker = side_checkpoint("reranker", kind="bert")
    srv = MlxcelServer(["-m", str(embedder), "--reranker-model", str(ranker),
                        "--api-key", KEY, "--embedding-batch-size", "8"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


def test_the_openai_sdk_gets_unit_vectors_in_float_and_base64(sdk):
    texts = ["a river runs past the quiet stone", "lantern"]
    b64 = sdk.embeddings.create(model="emb", input=texts)  # the SDK's default: base64
    floats = sdk.embeddings.create(model="emb", input=texts, encoding_format="float")
    assert [d.index for d in b64.data] == [0, 1]
    assert b64.usage.prompt_tokens == b64.usage.total_tokens > 2
    for a, b in zip(b64.data, floats.data, strict=True):
        assert np.allclose(a.embedding, b.embedding, atol=1e-6)
        assert np.linalg.norm(b.embedding) == pytest.approx(1.0, abs=1e-5)
    short = sdk.embeddings.create(model="emb", input="lantern", dimensions=16,
                                  encoding_format="float")
    assert len(short.data[0].embedding) == 16
    assert np.linalg.norm(short.data[0].embedding) == pytest.approx(1.0, abs=1e-5)


def test_sdk_errors_name_the_input(sdk):
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="emb", input=[[1, 2], [10 ** 9]])
    assert err.value.body["param"] == "input[1]"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="emb", input=["ok", "word " * 5000])
    assert err.value.body["param"] == "input[1]" and "too large" in err.value.message


@pytest.mark.parametrize("value,count", [
    ("", 1), ([12, 34, "string", 56, 78], 1), (["string1", [12, 34, 56]], 2),
    ([[12, 34, 56], [12, "string", 34, 56]], 2), ({"prompt_string": "string"}, 1),
    (["string1", {"prompt_string": "string2"},
      {"content": [{"type": "text", "text": "string3"}]}], 3),
])
def test_llama_servers_input_forms(server, value, count):
    """llama-server's own input forms (its test suite's cases): an empty text, a list of
    ids and texts as one input, prompt objects; a content object's text parts embed as
    their joined text."""
    import httpx

    with httpx.Client(base_url=server.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/embeddings", json={"input": value})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == count
        joined = c.post("/v1/embeddings", json={"input": ["hello world", {"content": [
            {"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]})
        image = c.post("/v1/embeddings", json={"input": {"content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}})
    a, b = (d["embedding"] for d in joined.json()["data"])
    assert a == b
    assert image.status_code == 400 and image.json()["error"]["param"] == "input.content[0]"


def test_rerank_and_models_over_http(server):
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as c:
        ranked = c.post("/v1/rerank", json={"query": "river", "documents": ["a", "b c"],
                                            "top_n": 1}).json()
        models = c.get("/v1/models").json()["data"]
        health = c.get("/health").json()
    assert len(ranked["results"]) == 1 and 0 <= ranked["results"][0]["relevance_score"] <= 1
    assert sorted(m["capabilities"][0] for m in models) == ["embedding", "rerank"]
    assert health["capabilities"] == ["embedding", "rerank"]


def test_chat_clients_get_501_in_their_sdks_error_types(server, sdk):
    with pytest.raises(openai.APIStatusError) as err:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 501 and "/v1/embeddings" in err.value.message
    claude = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        claude.messages.create(model="m", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 501 and "/v1/rerank" in str(err.value)
