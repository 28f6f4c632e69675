"""OpenAI routes in process: shapes, SSE order, errors naming the field."""

from __future__ import annotations

import json

import pytest
from apphelpers import make_client, wait_ready

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8,
        "temperature": 0}


def sse_events(response):
    frames = [line[len("data: "):] for line in response.text.split("\n\n") if line]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
def test_chat_completion_shape(client, path):
    r = client.post(path, json={**CHAT, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "tiny" and body["system_fingerprint"] is None
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"],
                                                                   str)
    assert choice["finish_reason"] == "length"
    u = body["usage"]
    assert u["completion_tokens"] == 8 and u["total_tokens"] == u["prompt_tokens"] + 8
    assert r.headers["x-request-id"]


def test_usage_prompt_tokens_match_tokenize(client):
    ids = client.post("/tokenize", json={"content": "<|im_start|>user\nHello there<|im_end|>\n"
                                                    "<|im_start|>assistant\n"}).json()["tokens"]
    body = client.post("/v1/chat/completions", json=CHAT).json()
    assert body["usage"]["prompt_tokens"] == len(ids)


def test_chat_stream_order_and_usage_chunk(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "ignore_eos": True,
                                                  "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1
    finish = events[-2]
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    contents = [e["choices"][0]["delta"].get("content") for e in events[1:-2]]
    assert all(isinstance(c, str) and c for c in contents)
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])


def test_stream_text_equals_non_stream_text(client):
    whole = client.post("/v1/chat/completions", json={**CHAT, "ignore_eos": True}).json()
    r = client.post("/v1/chat/completions", json={**CHAT, "ignore_eos": True, "stream": True})
    events = sse_events(r)
    assert "usage" not in events[-1]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == whole["choices"][0]["message"]["content"]


def test_completions_plain_and_streaming(client):
    req = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
           "ignore_eos": True}
    body = client.post("/v1/completions", json=req).json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6
    events = sse_events(client.post("/v1/completions", json={**req, "stream": True}))
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == body["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_is_not_emitted(client):
    req = {"prompt": "a b c", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    full = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    stop = full[3:6]
    assert stop.strip(), full
    cut = client.post("/v1/completions", json={**req, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full[: full.index(stop)]


def test_temperature_zero_is_greedy(client):
    a = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    b = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    assert a == b


def test_seed_reproduces_sampled_output(client):
    req = {**CHAT, "temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0, "seed": 7,
           "max_tokens": 16, "ignore_eos": True}
    outs = {client.post("/v1/chat/completions", json=req).json()["choices"][0]["message"]
            ["content"] for _ in range(2)}
    assert len(outs) == 1


@pytest.mark.parametrize("body,field", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
    ({"messages": "hi"}, "messages"),
    ({}, "messages"),
])
def test_bad_chat_requests_are_400_naming_the_field(client, body, field):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and field in err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'{"messages": [}'])
def test_malformed_json_is_400(client, raw):
    r = client.post("/v1/chat/completions", content=raw,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_prompt_too_long_is_context_length_exceeded(tiny_checkpoint):
    with make_client(tiny_checkpoint, ctx_size=64, parallel=2) as c:
        wait_ready(c)
        r = c.post("/v1/completions", json={"prompt": "word " * 200})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert c.get("/health").json()["context_size"] == 32
        ok = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 500,
                                              "ignore_eos": True, "temperature": 0}).json()
        assert ok["usage"]["total_tokens"] <= 32  # max_tokens clamped to what fits


def test_image_input_on_text_model_is_refused(client):
    msg = {"role": "user", "content": [{"type": "text", "text": "what is it"},
                                       {"type": "image_url",
                                        "image_url": {"url": "data:image/png;base64,AA=="}}]}
    r = client.post("/v1/chat/completions", json={"messages": [msg]})
    assert r.status_code == 501 and "text only" in r.json()["error"]["message"]


def test_models_lists_the_one_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
    assert body["data"][0]["owned_by"] == "user" and body["data"][0]["object"] == "model"


def test_unknown_route_is_404_in_openai_format(client):
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


FN = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "zz", "function": FN}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {**FN, "name": ""}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": FN},
                {"type": "function", "function": {**FN, "name": 5}}]},
     "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {**FN, "parameters": 5}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {**FN, "description": ["x"]}}]},
     "tools[0].function.description"),
    ({"parallel_tool_calls": "x"}, "parallel_tool_calls"),
])
def test_malformed_tools_are_400_naming_the_field(client, extra, param):
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert param in err["message"]


def test_a_well_formed_tool_is_accepted(client):
    tools = [{"type": "function", "function": {**FN, "description": "d", "strict": True}}]
    r = client.post("/v1/chat/completions",
                    json={**CHAT, "tools": tools, "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
