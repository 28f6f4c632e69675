"""llama-server's native /completion in process: fields, timings, streaming, stop_type,
n_probs, prompt shapes, the prompt cache, and every refusal."""

from __future__ import annotations

import json

import pytest
from apphelpers import make_client, wait_ready

GREEDY = {"temperature": 0, "ignore_eos": True}
FINAL_KEYS = {"index", "content", "tokens", "stop", "model", "tokens_predicted",
              "tokens_evaluated", "generation_settings", "has_new_line", "truncated",
              "stop_type", "stopping_word", "tokens_cached", "timings"}
TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
# a request whose rows drafted (prompt lookup is on by default) reports its rounds too
DRAFT_KEYS = {"draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"}


def native(client, **body):
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def frames(response):
    """The SSE frames of a native stream (which has no [DONE])."""
    assert response.headers["content-type"].startswith("text/event-stream")
    raw = [part for part in response.text.split("\n\n") if part]
    assert all(part.startswith("data: ") for part in raw)
    return [json.loads(part[len("data: "):]) for part in raw]


def tokens_of(client, text, add_special=False):
    return client.post("/tokenize", json={"content": text, "add_special": add_special}
                       ).json()["tokens"]


def test_fields_and_timings(client):
    body = native(client, prompt="The capital of France is", n_predict=7, return_tokens=True,
                  cache_prompt=False, **GREEDY)
    assert set(body) == FINAL_KEYS
    assert body["stop"] is True and body["stop_type"] == "limit" and body["stopping_word"] == ""
    assert body["tokens_predicted"] == 7 == len(body["tokens"])
    assert body["tokens_evaluated"] == len(tokens_of(client, "The capital of France is"))
    assert body["model"] == "tiny" and body["truncated"] is False and body["tokens_cached"] == 0
    t = body["timings"]
    assert set(t) - DRAFT_KEYS == TIMING_KEYS and set(t) & DRAFT_KEYS in (set(), DRAFT_KEYS)
    assert t["prompt_n"] == body["tokens_evaluated"] and t["predicted_n"] == 7
    assert t["prompt_ms"] > 0 and t["predicted_ms"] >= 0
    assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"])
    assert t["prompt_per_second"] == pytest.approx(1e3 * t["prompt_n"] / t["prompt_ms"])
    settings = body["generation_settings"]
    assert settings["n_predict"] == 7 and settings["temperature"] == 0
    assert settings["n_ctx"] == 4096 and settings["stream"] is False
    assert settings["seed"] == 18446744073709551615 and settings["ignore_eos"] is True
    assert settings["grammar"] == "" and settings["grammar_lazy"] is False
    assert settings["grammar_triggers"] == [] == settings["preserved_tokens"]
    assert settings["speculative.n_max"] == 16 and settings["speculative.n_min"] == 0
    text = client.post("/detokenize", json={"tokens": body["tokens"]}).json()["content"]
    assert text == body["content"]


def test_streaming_matches_the_whole_answer(client):
    req = {"prompt": "Once upon a time", "n_predict": 9, **GREEDY}
    whole = native(client, **req, return_tokens=True)
    events = frames(client.post("/completion", json={**req, "stream": True}))
    chunks, last = events[:-1], events[-1]
    assert chunks and all(c["stop"] is False and set(c) == {
        "index", "content", "tokens", "stop", "tokens_predicted", "tokens_evaluated"}
        for c in chunks)
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]
    assert [c["tokens_predicted"] for c in chunks] == sorted(c["tokens_predicted"]
                                                             for c in chunks)
    assert last["stop"] is True and last["content"] == "" and set(last) == FINAL_KEYS
    assert last["tokens_predicted"] == 9 and last["stop_type"] == "limit"
    assert last["generation_settings"]["stream"] is True
    assert last["timings"]["predicted_n"] == 9


def test_timings_per_token_puts_timings_in_every_chunk(client):
    events = frames(client.post("/completion", json={
        "prompt": "a b", "n_predict": 4, "stream": True, "timings_per_token": True, **GREEDY}))
    assert all(set(e["timings"]) == TIMING_KEYS for e in events)
    assert [e["timings"]["predicted_n"] for e in events[:-1]] == [
        e["tokens_predicted"] for e in events[:-1]]


def test_stop_word_cuts_and_is_named(client):
    req = {"prompt": "The quick brown fox", "n_predict": 16, **GREEDY}
    full = native(client, **req)["content"]
    stop = full[4:6]
    body = native(client, **req, stop=["zzzz-never", stop])
    assert body["stop_type"] == "word" and body["stopping_word"] == stop
    assert body["content"] == full[:full.find(stop)]
    assert body["tokens_predicted"] < 16


@pytest.fixture(scope="module")
def eos_client(client, mlxcel_checkpoint_cache):
    """The default checkpoint's weights with its first greedy token as the EOS."""
    from mlxcel.testing.checkpoint import cached_checkpoint

    first = native(client, prompt="Hello", n_predict=1, return_tokens=True, **GREEDY)
    path = cached_checkpoint("qwen3", mlxcel_checkpoint_cache,
                             generation_config={"eos_token_id": first["tokens"]})
    with make_client(path, parallel=1) as c:
        wait_ready(c)
        yield c


def test_stop_type_eos(eos_client):
    body = native(eos_client, prompt="Hello", n_predict=8, temperature=0)
    assert body["stop_type"] == "eos" and body["stopping_word"] == ""
    assert body["tokens_predicted"] == 1 and body["content"] == ""
    ignored = native(eos_client, prompt="Hello", n_predict=3, **GREEDY)
    assert ignored["stop_type"] == "limit" and ignored["tokens_predicted"] == 3


def test_n_probs(client):
    body = native(client, prompt="Hello there", n_predict=5, n_probs=3, return_tokens=True,
                  **GREEDY)
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == body["tokens"]
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]
        assert p["bytes"] == list(p["token"].encode("utf-8")) and p["logprob"] <= 0
    events = frames(client.post("/completion", json={
        "prompt": "Hello there", "n_predict": 5, "n_probs": 3, "stream": True, **GREEDY}))
    streamed = [p["id"] for e in events[:-1] for p in e.get("completion_probabilities", [])]
    assert streamed == body["tokens"]
    assert "completion_probabilities" not in native(client, prompt="x", n_predict=2)


def test_prompt_as_ids_and_mixed(client, llama_client):
    text = "Paris is a city"
    ids = tokens_of(client, text)
    by_text = native(client, prompt=text, n_predict=5, **GREEDY)
    by_ids = native(client, prompt=ids, n_predict=5, **GREEDY)
    assert by_ids["content"] == by_text["content"]
    assert by_ids["tokens_evaluated"] == by_text["tokens_evaluated"] == len(ids)
    mixed = native(client, prompt=[*ids, " in France"], n_predict=2, **GREEDY)
    assert mixed["tokens_evaluated"] == len(ids) + len(tokens_of(client, " in France"))
    # llama's BOS: added before a leading string, not before leading ids
    with_bos = tokens_of(llama_client, text, add_special=True)
    assert native(llama_client, prompt=text, n_predict=1)["tokens_evaluated"] == len(with_bos)
    plain = tokens_of(llama_client, text)
    assert native(llama_client, prompt=[*plain, "!"], n_predict=1)["tokens_evaluated"] == \
        len(plain) + len(tokens_of(llama_client, "!"))
    assert native(client, prompt={"prompt_string": text}, n_predict=1)["tokens_evaluated"] \
        == len(ids)


def test_several_prompts_answer_a_list(client):
    r = client.post("/completion", json={"prompt": ["one", [5, 6, 7]], "n_predict": 3,
                                         **GREEDY})
    assert r.status_code == 200
    first, second = r.json()
    assert (first["index"], second["index"]) == (0, 1)
    assert second["tokens_evaluated"] == 3 and first["tokens_predicted"] == 3
    assert first["content"] == native(client, prompt="one", n_predict=3, **GREEDY)["content"]


def test_more_prompts_than_slots_is_400_naming_the_prompt(client):
    """One request may not take every slot and the whole queue (the client has 2 slots)."""
    r = client.post("/completion", json={"prompt": ["a", "b", "c"], "n_predict": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and "at most 2" in err["message"]
    assert client.post("/completion", json={"prompt": ["a", "b"], "n_predict": 1}
                       ).status_code == 200


def test_completions_alias_is_native_and_v1_stays_openai(client):
    body = client.post("/completions", json={"prompt": "hi", "n_predict": 2}).json()
    assert body["stop"] is True and "choices" not in body
    openai = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).json()
    assert openai["object"] == "text_completion"


def test_n_predict_zero_evaluates_only(client):
    body = native(client, prompt="warm the cache", n_predict=0)
    assert body["content"] == "" and body["tokens_predicted"] == 0
    assert body["stop_type"] == "limit" and body["timings"]["predicted_n"] == 0
    assert body["generation_settings"]["n_predict"] == 0


def test_cache_prompt_and_tokens_cached(client):
    prompt = "You are a careful assistant. " * 20
    native(client, prompt=prompt, n_predict=2, **GREEDY)
    again = native(client, prompt=prompt + "Next", n_predict=2, **GREEDY)
    assert again["tokens_cached"] >= 16 and again["tokens_cached"] % 16 == 0
    t = again["timings"]
    assert t["cache_n"] == again["tokens_cached"]
    assert t["prompt_n"] == again["tokens_evaluated"] - again["tokens_cached"]
    cold = native(client, prompt=prompt + "Next", n_predict=2, cache_prompt=False, **GREEDY)
    assert cold["tokens_cached"] == 0 and cold["generation_settings"]["cache_prompt"] is False


def test_llama_meanings_of_values(client):
    settings = native(client, prompt="x", n_predict=2, temperature=-1, top_k=-5, seed=-1,
                      repeat_last_n=0, repeat_penalty=1.3, dry_multiplier=0.5,
                      dry_penalty_last_n=0, thinking_budget=64)["generation_settings"]
    assert settings["temperature"] == 0 and settings["top_k"] == 0
    assert settings["seed"] == 18446744073709551615
    assert settings["repeat_penalty"] == 1.0 and settings["dry_multiplier"] == 0.0
    assert settings["reasoning_budget"] == 64
    breakers = tokens_of(client, "\n")
    settings = native(client, prompt="x", n_predict=1, dry_sequence_breakers=["\n", 7],
                      n_predict_unknown_field=1, typical_p=0.9)["generation_settings"]
    assert settings["dry_sequence_breakers"] == [*breakers, 7]


def test_response_format_text_is_accepted(client):
    native(client, prompt="x", n_predict=1, response_format={"type": "text"})


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format"),
    ({"prompt": "x", "grammar": "root ::= ("}, "grammar"),
    ({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {"type": "object"}},
     "grammar"),
    ({"prompt": "x", "json_schema": [1]}, "json_schema"),
    ({"prompt": "x", "logit_bias": [[1]]}, "logit_bias[0]"),
    ({"prompt": "x", "post_sampling_probs": True}, "post_sampling_probs"),
    ({"prompt": "x", "n_cmpl": 0}, "n_cmpl"),
    ({"prompt": "x", "n": 3}, "n"),
    ({"prompt": "x", "lora": [{"id": 0, "scale": 1.0}]}, "lora"),
    ({"prompt": "x", "n_predict": -2}, "n_predict"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "n_probs": 21}, "n_probs"),
    ({"prompt": "x", "n_probs": -1}, "n_probs"),
    ({"prompt": "x", "repeat_penalty": 0}, "repeat_penalty"),
    ({"prompt": "x", "repeat_last_n": -2}, "repeat_last_n"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "min_p": -0.1}, "min_p"),
    ({"prompt": "x", "dry_base": 0.5}, "dry_base"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "seed": -7}, "seed"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "dry_sequence_breakers": ["a long breaker string"]},
     "dry_sequence_breakers"),
    ({"prompt": "x", "thinking_budget_tokens": 5, "reasoning_budget_tokens": 6},
     "thinking_budget_tokens"),
    ({"prompt": "x", "reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ({"prompt": "x", "stop": ["s"] * 17}, "stop"),
    ({"prompt": "x", "min_count": -1}, "min_count"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 999999]}, "prompt"),
    ({"prompt": [[1, 2], [3, -1]]}, "prompt"),
    ({"prompt": [1, 2.5]}, "prompt"),
    ({"prompt": {"text": "x"}}, "prompt"),
    ({"prompt": ["a", "b"], "stream": True}, "prompt"),
])
def test_invalid_requests_are_400_naming_the_field(client, body, param):
    r = client.post("/completion", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert param in err["message"] or err["message"].startswith("token id")


def test_other_refusals(client):
    missing = client.post("/completion", json={"n_predict": 1})
    assert missing.status_code == 400 and "prompt" in missing.json()["error"]["message"]
    media = client.post("/completion", json={"prompt": {"prompt_string": "x",
                                                         "multimodal_data": ["aGk="]}})
    assert media.status_code == 501
    assert media.json()["error"]["type"] == "not_supported_error"
    long = client.post("/completion", json={"prompt": [5] * 4096})
    assert long.status_code == 400 and long.json() == {"error": {  # llama-server's shape
        "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 4096,
        "n_ctx": 4096, "message": "request (4096 tokens) exceeds the available context "
        "size (4096 tokens), try increasing it"}}
    lane = client.post("/completion", json={"prompt": "x"}, headers={"X-Priority": "urgent"})
    assert lane.status_code == 400 and lane.json()["error"]["param"] == "X-Priority"


def test_a_reasoning_budget_closes_a_block_the_raw_prompt_opened(client):
    """The tiny checkpoint writes ``<think>``: a raw prompt ending inside a block gets its
    budget's tokens, then the forced ``</think>``."""
    r = client.post("/completion", json={"prompt": "<|im_start|>assistant\n<think>\n",
                                         "n_predict": 6, "temperature": 0, "ignore_eos": True,
                                         "thinking_budget_tokens": 2, "return_tokens": True})
    assert r.status_code == 200, r.text
    body = r.json()
    tok = client.app.state["ctx"].engine.checkpoint.tokenizer
    close = tok.encode("</think>")
    assert body["tokens"][2:2 + len(close)] == close
    assert body["generation_settings"]["reasoning_budget"] == 2
