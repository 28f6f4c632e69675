"""End to end: llama-server's native routes on the real mlxcel-server process, read the way
a llama.cpp client reads them (JSON bodies and ``data:`` lines over plain HTTP)."""

from __future__ import annotations

import json

import httpx
import pytest
from mlxcel.testing.e2e import server_client
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
KEY = {"Authorization": "Bearer k-native"}
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")


@pytest.fixture(scope="module")
def fim_checkpoint(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", mlxcel_checkpoint_cache, extra_special_tokens=FIM)


@pytest.fixture(scope="module")
def http(fim_checkpoint):
    srv = Server(["--model", str(fim_checkpoint), "--parallel", "2", "--api-key", "k-native"])
    with httpx.Client(base_url=srv.base_url, headers=KEY, timeout=60) as client:
        yield client
    srv.stop()


@pytest.fixture(scope="module")
def plain_http(tiny_checkpoint):
    with server_client(["--model", str(tiny_checkpoint), "--parallel", "1"]) as client:
        yield client


REQ = {"prompt": "Building a website can be done in", "n_predict": 8, "temperature": 0,
       "ignore_eos": True}


def test_completion_whole_and_streamed(http):
    whole = http.post("/completion", json=REQ).json()
    assert whole["stop"] is True and whole["stop_type"] == "limit"
    assert whole["tokens_predicted"] == 8 == whole["timings"]["predicted_n"]
    assert whole["timings"]["prompt_n"] + whole["tokens_cached"] == whole["tokens_evaluated"]
    events = []
    with http.stream("POST", "/completions", json={**REQ, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(json.loads(line[len("data: "):]))
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["generation_settings"]["stream"] is True


def test_infill_and_apply_template(http):
    body = http.post("/infill", json={"input_prefix": "def f(x):\n    return ",
                                      "input_suffix": "\n", "n_predict": 3,
                                      "temperature": 0, "ignore_eos": True}).json()
    assert body["stop"] is True and body["tokens_predicted"] == 3
    messages = [{"role": "user", "content": "hi"}]
    prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "hi" in prompt


def test_refusals_in_llama_servers_shape(http, plain_http):
    r = http.post("/completion", json={**REQ, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/completion", json=REQ, headers={"Authorization": "x"}).status_code == 401
    infill = plain_http.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert infill.status_code == 501 and infill.json()["error"]["type"] == "not_supported_error"
    embed = plain_http.post("/embedding", json={"content": "x"})
    assert embed.status_code == 501 and embed.json()["error"]["type"] == "not_implemented"
