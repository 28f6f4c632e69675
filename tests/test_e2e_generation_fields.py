"""llama-server's generation fields through the real ``mlxcel-server``, spelled as its
clients send them: ``grammar`` (GBNF, via llguidance), ``logit_bias`` in every form,
``ignore_eos`` as EOS -inf in ``generation_settings.logit_bias``, and the assistant prefill
beside vLLM's ``continue_final_message``."""

from __future__ import annotations

import json

import pytest
from mlxcel.testing.e2e import server_client

pytestmark = pytest.mark.slow
FIVE = ['root ::= "aaaaa"', 'root ::= "a"{5}']
USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def http(tiny_checkpoint, tmp_path_factory):
    cache = tmp_path_factory.mktemp("grammar-cache")
    with server_client(["--model", str(tiny_checkpoint), "--parallel", "4",
                        "--grammar-cache-dir", str(cache)], timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def eos_ids(tiny_checkpoint):
    ids = json.loads((tiny_checkpoint / "generation_config.json").read_text())["eos_token_id"]
    return sorted(ids if isinstance(ids, list) else [ids])


def ok(r):
    assert r.status_code == 200, r.text
    return r.json()


def tokens(http, text: str) -> list[int]:
    return ok(http.post("/tokenize", json={"content": text}))["tokens"]


# -- grammar ---------------------------------------------------------------------------------
@pytest.mark.parametrize("grammar", FIVE)
def test_grammar_forces_five_as_on_every_route(http, grammar):
    for seed in (1, 2, 3):
        body = ok(http.post("/completion", json={
            "prompt": "hello", "grammar": grammar, "n_predict": 32, "temperature": 1.5,
            "seed": seed}))
        assert body["content"] == "aaaaa" and body["stop_type"] == "eos"
        chat = ok(http.post("/v1/chat/completions", json={
            "messages": USER, "grammar": grammar, "max_tokens": 32, "temperature": 1.5,
            "seed": seed}))["choices"][0]
        assert chat["message"]["content"] == "aaaaa" and chat["finish_reason"] == "stop"
    # ignore_eos bans EOS, yet the grammar's end (where only EOS may follow) still ends it
    held = ok(http.post("/completion", json={"prompt": "hello", "grammar": grammar,
                                             "n_predict": 32, "ignore_eos": True}))
    assert held["content"] == "aaaaa" and held["stop_type"] == "eos"
    legacy = ok(http.post("/v1/completions", json={
        "prompt": "hello", "grammar": grammar, "max_tokens": 32}))["choices"][0]
    assert legacy["text"] == "aaaaa"
    streamed = http.post("/v1/chat/completions", json={
        "messages": USER, "grammar": grammar, "max_tokens": 32, "stream": True})
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in streamed.text.split("\n\n")
                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text == "aaaaa"


def test_json_schema_field_on_completion_and_chat(http):
    body = ok(http.post("/completion", json={
        "prompt": "x", "json_schema": {"type": "boolean"}, "n_predict": 16}))
    assert body["content"] in ("true", "false")
    chat = ok(http.post("/v1/chat/completions", json={
        "messages": USER, "json_schema": {"type": "boolean"}, "max_tokens": 16}))
    assert chat["choices"][0]["message"]["content"] in ("true", "false")


@pytest.mark.parametrize("path,body,words", [
    ("/completion", {"prompt": "x", "grammar": "root ::= ("}, "not valid GBNF"),
    ("/completion", {"prompt": "x", "grammar": "root ::= undefined_rule"}, "undefined_rule"),
    ("/completion", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {}},
     "Cannot use both"),
    ("/v1/chat/completions", {"messages": USER, "grammar": "root ::= ("}, "not valid GBNF"),
    ("/v1/chat/completions", {"messages": USER, "grammar": 'root ::= "a"', "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "Cannot use both"),
    ("/v1/chat/completions", {"messages": USER, "grammar": 'root ::= "a"', "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
     "with tools"),
])
def test_invalid_grammar_is_a_400(http, path, body, words):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "grammar"
    assert words in error["message"]


# -- logit_bias ------------------------------------------------------------------------------
def generated(http, route: str, **fields) -> list[int]:
    """The greedy answer's token ids (six of them, EOS ignored)."""
    if route == "/completion":
        body = ok(http.post(route, json={"prompt": "Once upon a time", "n_predict": 6,
                                         "temperature": 0, "ignore_eos": True,
                                         "return_tokens": True, **fields}))
        return body["tokens"]
    body = ok(http.post(route, json={"prompt": "Once upon a time", "max_tokens": 6,
                                     "temperature": 0, "ignore_eos": True, **fields}))
    return tokens(http, body["choices"][0]["text"])


def test_logit_bias_in_llama_servers_forms(http):
    plain = generated(http, "/completion")
    first = plain[0]
    for form in ([[first, False]], {str(first): False}):
        assert first not in generated(http, "/completion", logit_bias=form)
    hello = set(tokens(http, " hello"))
    for form in ([[" hello", 1000]], {" hello": 1000}):
        assert set(generated(http, "/completion", logit_bias=form)) <= hello
    forced = plain[-1]
    assert generated(http, "/completion", logit_bias=[[forced, 1000]]) == [forced] * 6


def test_logit_bias_in_openais_form(http):
    target = tokens(http, " the")[0]
    text = ok(http.post("/v1/completions", json={
        "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
        "ignore_eos": True, "logit_bias": {str(target): 100}}))["choices"][0]["text"]
    assert text == " the" * 4
    r = http.post("/v1/chat/completions", json={"messages": USER,
                                                "logit_bias": {str(target): 100.5}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = http.post("/completion", json={"prompt": "x", "logit_bias": [[10 ** 9, 1]]})
    assert r.status_code == 400 and "out of vocabulary range" in r.json()["error"]["message"]


def test_ignore_eos_is_eos_at_minus_inf_in_generation_settings(http, eos_ids):
    settings = ok(http.post("/completion", json={
        "prompt": "x", "n_predict": 2, "ignore_eos": True,
        "logit_bias": [[7, 0.5]]}))["generation_settings"]
    assert settings["ignore_eos"] is True
    assert settings["logit_bias"] == [{"bias": 0.5, "token": 7}] + [
        {"bias": None, "token": t} for t in eos_ids]
    plain = ok(http.post("/completion", json={"prompt": "x", "n_predict": 2}))
    assert plain["generation_settings"]["logit_bias"] == []
    props = ok(http.get("/props"))["default_generation_settings"]
    assert props["logit_bias"] == [] and props["ignore_eos"] is False


# -- assistant prefill -----------------------------------------------------------------------
def rendered(http, messages, **flags) -> str:
    return ok(http.post("/apply-template", json={"messages": messages, **flags}))["prompt"]


def test_a_final_assistant_message_is_continued(http):
    started = [*USER, {"role": "assistant", "content": "Once upon a"}]
    head = rendered(http, USER)
    assert rendered(http, started) == head + "Once upon a"  # llama-server's prefill
    assert rendered(http, started, continue_final_message=True).endswith("Once upon a")
    closed = rendered(http, started, add_generation_prompt=True)
    assert "Once upon a<|im_end|>" in closed and closed.endswith("<|im_start|>assistant\n")
    answer = ok(http.post("/v1/chat/completions", json={
        "messages": started, "max_tokens": 3, "temperature": 0}))
    assert answer["usage"]["prompt_tokens"] == len(tokens(http, head + "Once upon a"))


def test_prefill_refusals(http):
    started = [*USER, {"role": "assistant", "content": "Once upon a"}]
    both = http.post("/v1/chat/completions", json={
        "messages": started, "continue_final_message": True, "add_generation_prompt": True})
    assert both.status_code == 400
    assert both.json()["error"]["param"] == "continue_final_message"
    twice = http.post("/v1/chat/completions", json={
        "messages": [*started, {"role": "assistant", "content": "again"}]})
    assert twice.status_code == 400 and "2 or more assistant" in twice.json()["error"]["message"]
