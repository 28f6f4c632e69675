"""llama-server's ``grammar_lazy`` / ``grammar_triggers`` / ``preserved_tokens`` on the
real app and engine: the answer is the free one up to the trigger, then the grammar's;
a single-token word must be preserved; a lazy grammar without a trigger, an unknown
trigger type and a bad pattern are 400s naming the field, in each dialect's shape."""

from __future__ import annotations

import json
import re

import pytest

PROMPT = [5, 6, 7, 8, 9, 10]
SEEDED = {"temperature": 1.0, "seed": 1, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def native(client, **body):
    r = client.post("/completion", json={"prompt": PROMPT, "return_tokens": True,
                                         "n_predict": 32, **SEEDED, **body})
    assert r.status_code == 200, r.text
    return r.json()


def piece(client, token: int) -> str:
    return client.post("/detokenize", json={"tokens": [token]}).json()["content"]


@pytest.fixture(scope="module")
def trigger(client):
    """A letter token of the free answer (not its first): its place, id and text."""
    tokens = native(client)["tokens"]
    for k, token in enumerate(tokens[1:], 1):
        text = piece(client, token)
        if re.fullmatch(r"[A-Za-z]+", text):
            return tokens, k, token, text
    pytest.skip("the free answer has no letter token")


def grammar(text: str) -> str:
    return f'root ::= {json.dumps(text)} "aaaaa"'


@pytest.mark.parametrize("how", ["token", "preserved word"])
def test_the_answer_is_free_up_to_the_trigger_then_the_grammars(client, trigger, how):
    free, k, token, text = trigger
    triggers = [{"type": 0, "value": text, "token": token}] if how == "token" else \
        [{"type": 1, "value": text}]
    out = native(client, grammar=grammar(text), grammar_lazy=True,
                 grammar_triggers=triggers, preserved_tokens=[text])
    assert out["tokens"][:k + 1] == free[:k + 1]  # free until the trigger token
    assert out["content"].endswith(text + "aaaaa") and out["stop_type"] == "eos"
    settings = out["generation_settings"]  # as llama-server reports what it ran with
    assert settings["grammar"] == grammar(text) and settings["grammar_lazy"] is True
    assert settings["grammar_triggers"] == triggers
    assert settings["preserved_tokens"] == [text]


def test_a_pattern_trigger_starts_at_its_group(client, trigger):
    free, k, token, text = trigger
    out = native(client, grammar=grammar(text), grammar_lazy=True,
                 grammar_triggers=[{"type": 2, "value": f"[\\s\\S]?({re.escape(text)})"}])
    assert out["tokens"][:k] == free[:k]
    assert out["content"].endswith(text + "aaaaa") and out["stop_type"] == "eos"


def test_without_grammar_lazy_the_grammar_holds_from_the_start(client, trigger):
    _, _, token, text = trigger
    out = native(client, grammar=grammar(text),
                 grammar_triggers=[{"type": 0, "value": text, "token": token}])
    assert out["content"] == text + "aaaaa"


def test_a_lazy_grammar_on_the_openai_routes(client, trigger):
    _, _, token, text = trigger
    lazy = {"grammar": grammar(text), "grammar_lazy": True, "max_tokens": 32, **SEEDED,
            "grammar_triggers": [{"type": 0, "value": text, "token": token}]}
    r = client.post("/v1/completions", json={"prompt": PROMPT, **lazy})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].endswith(text + "aaaaa")
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], **lazy,
        "grammar_triggers": [{"type": 2, "value": "never-in-this-answer"}]})
    assert r.status_code == 200 and not r.json()["choices"][0]["message"]["content"] \
        .endswith("aaaaa")  # no trigger: the answer stays free


@pytest.mark.parametrize("fields,param,words", [
    ({"grammar_lazy": True}, "grammar_triggers", "no triggers"),
    ({"grammar_lazy": True, "grammar_triggers": []}, "grammar_triggers", "no triggers"),
    ({"grammar_triggers": [{"type": 7, "value": "x"}]}, "grammar_triggers[0].type",
     "Unknown grammar trigger type"),
    ({"grammar_triggers": [{"type": 2, "value": "("}]}, "grammar_triggers[0].value",
     "regular expression"),
    ({"grammar_triggers": [{"type": 0, "value": "x"}]}, "grammar_triggers[0].token",
     "token id"),
    ({"grammar_triggers": "x"}, "grammar_triggers", "list"),
    ({"grammar_triggers": [{"type": 1, "value": "a"}]}, "grammar_triggers[0].value",
     "should be marked as preserved token"),
])
def test_malformed_lazy_fields_are_400s_naming_them(client, fields, param, words):
    body = {"grammar": 'root ::= "a"', **fields}
    for path, extra in (("/completion", {"prompt": "x"}),
                        ("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}]})):
        r = client.post(path, json={**extra, **body})
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], (path, error)
