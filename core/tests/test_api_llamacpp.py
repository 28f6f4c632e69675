"""llama-server routes in process: tokenize, detokenize, health, props, auth."""

from __future__ import annotations

import threading

import pytest
from apphelpers import make_client, wait_ready
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.engine.client import EngineClient
from mlxcel.settings import Settings


def test_tokenize_roundtrip_and_add_special(client, llama_client):
    ids = client.post("/tokenize", json={"content": "Hello, world!"}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello, world!"}
    # qwen3 adds no BOS; llama prepends one only with add_special
    assert client.post("/tokenize", json={"content": "Hello", "add_special": True}).json() == \
        client.post("/tokenize", json={"content": "Hello"}).json()
    plain = llama_client.post("/tokenize", json={"content": "Hello"}).json()["tokens"]
    special = llama_client.post("/tokenize", json={"content": "Hello", "add_special": True}
                                ).json()["tokens"]
    assert special[1:] == plain and len(special) == len(plain) + 1
    bos = llama_client.post("/detokenize", json={"tokens": special[:1]}).json()["content"]
    assert bos == "<|begin_of_text|>"


@pytest.mark.parametrize("tokens,bad", [
    ([1, 2, -5, 999999], -5),
    ([1, 999999, -1], 999999),
    ([3, 2**40], 2**40),
    ([4, 2**63 - 1], 2**63 - 1),
])
def test_detokenize_out_of_vocab_is_500_with_first_bad_id(client, tokens, bad):
    """The spec's (and llama-server's) 500 server_error, naming the first bad id; ids are
    read as 64-bit, so those past 32 bits reach the range check; no partial text."""
    vocab = 512
    r = client.post("/detokenize", json={"tokens": tokens})
    assert r.status_code == 500
    assert r.json() == {"error": {
        "message": f"token id {bad} is out of vocabulary range (vocab_size {vocab})",
        "type": "server_error", "code": None}}


def test_detokenize_wrong_type_is_400(client):
    r = client.post("/detokenize", json={"tokens": ["a"]})
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"]


def test_health_and_root(client):
    for path in ("/health", "/"):
        body = client.get(path).json()
        assert body["status"] == "ok" and body["model"] == "tiny"
        assert body["batch"]["max_batch_size"] == 2
        assert body["context_size"] == 4096 and body["tool_call_parser"] == "mlxcel"
        assert set(body["observability"]) >= {"sequences_started", "total_decode_tokens"}


def test_live_is_200_while_health_says_busy_and_needs_no_key(auth_client, monkeypatch):
    """/health keeps llama-server's 503 while every slot is busy; /live says only that the
    process is up, for load balancers, with no API key."""
    from mlxcel.engine.client import EngineClient

    monkeypatch.setattr(EngineClient, "active_count", property(lambda self: self.parallel))
    busy = auth_client.get("/health")
    assert busy.status_code == 503 and busy.json()["status"] == "no slot available"
    live = auth_client.get("/live")
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert auth_client.head("/live").status_code == 200


def test_props(client):
    body = client.get("/props").json()
    d = body["default_generation_settings"]
    assert d["seed"] == 18446744073709551615
    assert body["total_slots"] == 2
    assert {"n_predict", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
            "repeat_last_n", "dry_multiplier", "dry_penalty_last_n"} <= set(d)


def test_loading_model_is_503_everywhere_but_stays_valid_json(tiny_checkpoint):
    gate = threading.Event()
    engine = EngineClient(lambda: gate.wait(30), parallel=1)
    app = create_app(Settings(model=str(tiny_checkpoint)), engine=engine)
    with TestClient(app) as c:
        try:
            r = c.get("/health")
            assert r.status_code == 503
            assert r.json() == {"status": "loading model", "tool_call_parser": None}
            r = c.post("/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "x"}], "stream": True})
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_busy"
        finally:
            gate.set()


@pytest.fixture(scope="module")
def auth_client(tiny_checkpoint):
    with make_client(tiny_checkpoint, api_key="s3cret", parallel=1) as c:
        wait_ready(c)
        yield c


@pytest.mark.parametrize("header,status,type_", [
    (None, 401, "missing_api_key"),
    ("Bearer wrong", 401, "invalid_api_key"),
    ("wrong", 401, "invalid_api_key"),
    ("Bearer s3cret", 200, None),
    ("s3cret", 200, None),
])
def test_api_key(auth_client, header, status, type_):
    headers = {"Authorization": header} if header else {}
    r = auth_client.get("/v1/models", headers=headers)
    assert r.status_code == status
    if type_:
        assert r.json()["error"]["type"] == type_
        assert "s3cret" not in r.text


@pytest.mark.parametrize("headers,status", [
    ({"x-api-key": "s3cret"}, 200),  # what the Anthropic SDK sends
    ({"x-api-key": "wrong"}, 401),
    ({"x-api-key": "  "}, 401),
    ({"Authorization": "Bearer wrong", "x-api-key": "s3cret"}, 200),  # any one matches
    ({"Authorization": "Bearer s3cret", "x-api-key": "wrong"}, 200),
])
def test_api_key_in_x_api_key(auth_client, headers, status):
    r = auth_client.get("/v1/models", headers=headers)
    assert r.status_code == status
    if status == 401:
        assert r.json()["error"]["type"] in ("invalid_api_key", "missing_api_key")
        assert "s3cret" not in r.text and "wrong" not in r.text


def test_api_key_not_accepted_in_query_and_health_open(auth_client):
    for query in ("api_key=s3cret", "key=s3cret", "x-api-key=s3cret", "token=s3cret"):
        r = auth_client.get(f"/v1/models?{query}")
        assert r.status_code == 401 and r.json()["error"]["type"] == "missing_api_key"
    assert auth_client.get("/health").status_code == 200
    assert auth_client.get("/").status_code == 200
    assert auth_client.post("/tokenize", json={"content": "x"}).status_code == 401
