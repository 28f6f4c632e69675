"""Reasoning through the HTTP surface, on the tiny checkpoint whose ChatML template writes
``<think>`` (detected): ``reasoning_only``, thinking budgets (the request's aliases and
``--reasoning-budget``) and ``--reasoning-format``."""

from __future__ import annotations

import json

import pytest
from apphelpers import make_client, wait_ready

CHAT = "/v1/chat/completions"
# the answer continues inside an open <think> block, so the first tokens are reasoning
THINKING = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "<think>\n"}],
            "continue_final_message": True, "max_tokens": 10, "temperature": 0,
            "ignore_eos": True}


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    with make_client(tiny_checkpoint) as c:
        wait_ready(c)
        yield c


def frames(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.split("\n\n")
            if line.startswith("data: {")]


def message(client, **body) -> dict:
    r = client.post(CHAT, json={**THINKING, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def close_at(client, budget: int) -> tuple[list[str], list[str]]:
    """The generated tokens (text) of a budgeted answer, and its reasoning's tokens."""
    r = client.post(CHAT, json={**THINKING, "thinking_budget_tokens": budget,
                                "logprobs": True}).json()
    tokens = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
    return tokens, r["choices"][0]["message"]


def test_the_checkpoint_detects_think_blocks(client):
    ckpt = client.app.state["ctx"].engine.checkpoint
    assert (ckpt.reasoning.open, ckpt.reasoning.close) == ("<think>", "</think>")


def test_an_answer_that_never_leaves_its_reasoning_is_reasoning_only(client):
    whole = message(client)
    assert whole["reasoning_content"] and whole["reasoning_only"] is True
    assert whole["content"] in ("", None)
    streamed = frames(client.post(CHAT, json={**THINKING, "stream": True}))
    last = [f for f in streamed if f["choices"]][-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["delta"]["reasoning_only"] is True
    assert all("reasoning_only" not in f["choices"][0]["delta"]
               for f in streamed if f["choices"] and f["choices"][0]["finish_reason"] is None)


def test_an_answer_with_content_has_no_reasoning_only(client):
    whole = message(client, messages=[{"role": "user", "content": "hi"}],
                    continue_final_message=False, chat_template_kwargs={
                        "enable_thinking": False})
    assert "reasoning_only" not in whole


@pytest.mark.parametrize("budget", [0, 3])
def test_a_thinking_budget_closes_the_block_after_that_many_tokens(client, budget):
    tokens, msg = close_at(client, budget)
    assert len(tokens) == 10
    assert msg.get("reasoning_content", "") == "".join(tokens[:budget])
    assert tokens[budget] == "</think>"
    assert msg.get("content") and "reasoning_only" not in msg


@pytest.mark.parametrize("field", ["thinking_budget_tokens", "reasoning_budget_tokens",
                                   "thinking_budget"])
def test_every_budget_alias_is_read(client, field):
    r = client.post(CHAT, json={**THINKING, field: 1, "logprobs": True}).json()
    tokens = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens[1:]).startswith("</think>")


@pytest.mark.parametrize("value", [-2, 1.5, "3", True])
def test_a_bad_budget_is_a_400_naming_the_field(client, value):
    r = client.post(CHAT, json={**THINKING, "thinking_budget_tokens": value})
    assert r.status_code == 400
    assert "thinking_budget_tokens" in r.json()["error"]["message"]


def test_minus_one_is_unrestricted(client):
    assert message(client, thinking_budget_tokens=-1)["reasoning_only"] is True


def test_the_server_budget_applies_when_the_request_sets_none(tiny_checkpoint):
    with make_client(tiny_checkpoint, reasoning_budget=2) as c:
        wait_ready(c)
        tokens, msg = close_at(c, 2)
        assert "".join(tokens[2:]).startswith("</think>")
        r = c.post(CHAT, json={**THINKING, "logprobs": True}).json()
        server = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
        assert server == tokens
        assert message(c, thinking_budget_tokens=-1)["reasoning_only"] is True


def test_a_zero_budget_renders_the_template_without_thinking(client):
    """``enable_thinking`` false: the template closes an empty block in the prompt, unless
    the request set the variable itself."""
    def prompt_tokens(**body):
        r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    plain, closed = prompt_tokens(), prompt_tokens(chat_template_kwargs={
        "enable_thinking": False})
    assert closed > plain
    assert prompt_tokens(thinking_budget_tokens=0) == closed
    assert prompt_tokens(thinking_budget_tokens=0, chat_template_kwargs={
        "enable_thinking": True}) == plain


@pytest.mark.parametrize("fmt", ["none", "deepseek-legacy", "deepseek", "auto"])
def test_reasoning_format_decides_where_reasoning_goes(tiny_checkpoint, fmt):
    with make_client(tiny_checkpoint, reasoning_format=fmt) as c:
        wait_ready(c)
        tokens, msg = close_at(c, 2)
    whole, reasoning = "".join(tokens), "".join(tokens[:2])
    assert tokens[2] == "</think>"  # the budget still closes the block
    if fmt == "none":
        assert msg["content"] == whole and "reasoning_content" not in msg
    elif fmt == "deepseek-legacy":
        assert msg["content"] == whole and msg["reasoning_content"] == reasoning
    else:
        assert msg["content"] == "".join(tokens[3:]) and msg["reasoning_content"] == reasoning


def test_a_budget_then_a_schema_the_constraint_starts_after_the_forced_close(client):
    """A prompt-opened block, a budget of 2 and a response schema: two reasoning tokens,
    the forced ``</think>``, then an answer that holds the schema."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    body = {**THINKING, "ignore_eos": False, "max_tokens": 60, "thinking_budget_tokens": 2,
            "logprobs": True, "response_format": {
                "type": "json_schema", "json_schema": {"name": "o", "schema": schema}}}
    r = client.post(CHAT, json=body).json()
    tokens = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
    msg = r["choices"][0]["message"]
    assert tokens[2] == "</think>" and msg["reasoning_content"] == "".join(tokens[:2])
    assert r["choices"][0]["finish_reason"] == "stop"
    assert json.loads(msg["content"]) in ({"ok": True}, {"ok": False})
