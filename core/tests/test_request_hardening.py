"""Bad inputs are 400s naming the field; legacy completion fields; size bounds; /health."""

from __future__ import annotations

import json
import time

import pytest
from apphelpers import make_client, wait_ready
from mlxcel.dialects.jsondepth import MAX_JSON_DEPTH

USER = {"role": "user", "content": "Hi"}
CHAT = "/v1/chat/completions"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat_raw(messages_json: str, **extra) -> bytes:
    fields = "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items())
    return f'{{"max_tokens": 2, "messages": {messages_json}{fields}}}'.encode()


def tool_call(function) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": function}]}


def assert_400(r, param: str, code: str | None = None) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code
    return err


# -- JSON depth ---------------------------------------------------------------------------
def test_json_nested_10000_deep_in_content(client):
    body = chat_raw(f'[{{"role": "user", "content": {nested(10_000)}}}]')
    err = assert_400(client.post(CHAT, content=body), "messages[0].content")
    assert str(MAX_JSON_DEPTH) in err["message"]


def test_json_nested_10000_deep_in_an_unknown_field(client):
    body = b'{"messages": [{"role": "user", "content": "x"}], "junk": ' + \
        nested(10_000).encode() + b"}"
    assert_400(client.post(CHAT, content=body), "junk[0][0]")


def test_json_over_the_limit_is_400_even_when_it_decodes(client):
    # the body object is level 1: "junk" holds levels 2 .. MAX_JSON_DEPTH + 1
    body = chat_raw('[{"role": "user", "content": "x"}]', junk=json.loads(nested(MAX_JSON_DEPTH)))
    assert_400(client.post(CHAT, content=body), "junk[0][0]")
    at_limit = chat_raw('[{"role": "user", "content": "x"}]',
                        chat_template_kwargs={"deep": json.loads(nested(MAX_JSON_DEPTH - 2))})
    assert client.post(CHAT, content=at_limit).status_code == 200


# -- tool calls ---------------------------------------------------------------------------
@pytest.mark.parametrize("function", ["get_weather", ["get_weather"], 7])
def test_tool_call_function_not_an_object(client, function):
    r = client.post(CHAT, json={"messages": [USER, tool_call(function), USER], "max_tokens": 2})
    err = assert_400(r, "messages[1].tool_calls[0].function")
    assert "object" in err["message"]


def test_tool_call_arguments_nested_10000_deep(client):
    fn = {"name": "f", "arguments": '{"a": ' + nested(10_000) + "}"}
    r = client.post(CHAT, json={"messages": [USER, tool_call(fn), USER], "max_tokens": 2})
    assert_400(r, "messages[1].tool_calls[0].function.arguments")


def test_tool_call_arguments_as_json_string_still_work(client):
    fn = {"name": "f", "arguments": '{"city": "Paris"}'}
    r = client.post(CHAT, json={"messages": [USER, tool_call(fn), USER], "max_tokens": 2})
    assert r.status_code == 200, r.text


# -- chat_template_kwargs -----------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("add_generation_prompt", False),
                                       ("messages", []), ("tools", [])])
def test_reserved_chat_template_kwargs(client, key, value):
    r = client.post(CHAT, json={"messages": [USER], "max_tokens": 2,
                                "chat_template_kwargs": {key: value}})
    assert_400(r, f"chat_template_kwargs.{key}")


def test_reserved_chat_template_kwargs_in_extra_body(client):
    r = client.post(CHAT, json={"messages": [USER], "max_tokens": 2,
                                "extra_body": {"chat_template_kwargs": {"messages": []}}})
    assert_400(r, "chat_template_kwargs.messages")


# -- content parts ------------------------------------------------------------------------
def test_text_part_with_a_non_string_text(client):
    msg = {"role": "user", "content": [{"type": "text", "text": 5}]}
    err = assert_400(client.post(CHAT, json={"messages": [msg]}), "messages[0].content[0].text")
    assert "must be a string" in err["message"] and "unknown" not in err["message"]


# -- /v1/completions legacy fields --------------------------------------------------------
COMPLETE = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}


def test_echo_prepends_the_prompt(client):
    plain = client.post("/v1/completions", json=COMPLETE).json()["choices"][0]["text"]
    echoed = client.post("/v1/completions", json={**COMPLETE, "echo": True}).json()
    assert echoed["choices"][0]["text"] == COMPLETE["prompt"] + plain
    assert echoed["usage"]["completion_tokens"] == 6


def test_echo_streaming_sends_the_prompt_first(client):
    plain = client.post("/v1/completions", json=COMPLETE).json()["choices"][0]["text"]
    r = client.post("/v1/completions", json={**COMPLETE, "echo": True, "stream": True})
    frames = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert frames[0]["choices"][0]["text"] == COMPLETE["prompt"]
    assert "".join(f["choices"][0]["text"] for f in frames) == COMPLETE["prompt"] + plain


def test_echo_of_token_ids_decodes_them(client):
    ids = client.post("/tokenize", json={"content": "Hello there"}).json()["tokens"]
    r = client.post("/v1/completions", json={**COMPLETE, "prompt": ids, "echo": True}).json()
    assert r["choices"][0]["text"].startswith("Hello there")


@pytest.mark.parametrize("extra,param", [
    ({"echo": True, "logprobs": 2}, "echo"),
    ({"best_of": 2}, "best_of"),
    ({"best_of": 0}, "best_of"),
    ({"suffix": "The end."}, "suffix"),
])
def test_unsupported_completion_fields(client, extra, param):
    assert_400(client.post("/v1/completions", json={**COMPLETE, **extra}), param)


def test_best_of_one_is_accepted(client):
    assert client.post("/v1/completions", json={**COMPLETE, "best_of": 1}).status_code == 200


# -- size bounds before tokenizing --------------------------------------------------------
def test_nine_megabyte_prompt_is_refused_without_tokenizing(client):
    big = "lorem ipsum dolor sit amet " * (9_000_000 // 27)
    for path, body, param in [
        (CHAT, {"messages": [{"role": "user", "content": big}]}, "messages"),
        ("/v1/completions", {"prompt": big}, "prompt"),
        ("/tokenize", {"content": big}, "content"),
    ]:
        started = time.perf_counter()
        r = client.post(path, json=body)
        elapsed = time.perf_counter() - started
        assert_400(r, param, "context_length_exceeded")
        assert elapsed < 3.0, f"{path} took {elapsed:.1f}s: the text was tokenized"
        assert big[:40] not in r.text


def test_byte_bound_is_just_above_what_can_fit(client):
    tok_bytes = client.app.state["ctx"].engine.checkpoint.tokenizer.max_token_bytes
    context = client.get("/health").json()["context_size"]
    bound = context * tok_bytes
    assert client.post("/tokenize", json={"content": "a" * bound}).status_code == 200
    assert_400(client.post("/tokenize", json={"content": "a" * (bound + 1)}), "content",
               "context_length_exceeded")


def test_tokenize_caps_the_token_count(tiny_checkpoint):
    from mlxcel.dialects.llamacpp.routes import TOKENIZE_MAX_TOKENS

    with make_client(tiny_checkpoint, parallel=1, ctx_size=200_000) as c:
        wait_ready(c)
        text = "lorem ipsum dolor sit amet " * (1_900_000 // 27)
        err = assert_400(c.post("/tokenize", json={"content": text}), "content")
        assert str(TOKENIZE_MAX_TOKENS) in err["message"]
        short = c.post("/tokenize", json={"content": text[:100_000]})
        assert short.status_code == 200 and len(short.json()["tokens"]) > 10_000


# -- /detokenize, /props, /health ---------------------------------------------------------
def test_detokenize_negative_id_names_it(client):
    r = client.post("/detokenize", json={"tokens": [3, -7, -8]})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "-7" in r.json()["error"]["message"] and "-8" not in r.json()["error"]["message"]


def test_props_model_path_is_the_folder_name(client, tiny_checkpoint):
    body = client.get("/props").json()
    assert body["model_path"] == tiny_checkpoint.name and "/" not in body["model_path"]


def test_health_reports_a_failed_engine(tiny_checkpoint):
    with make_client(tiny_checkpoint, parallel=1) as c:
        wait_ready(c)
        worker = c.app.state["ctx"].engine.worker
        state = worker.state
        worker.state, worker.error = "failed", "engine thread stopped: RuntimeError: boom"
        try:
            r = c.get("/health")
        finally:
            worker.state, worker.error = state, None
        assert r.status_code == 503
        assert r.json() == {"status": "error",
                            "error": "engine thread stopped: RuntimeError: boom"}
        assert c.get("/health").json()["status"] == "ok"
