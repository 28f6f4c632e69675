"""Speculative decoding on the real ``mlxcel-server``: the spec's timings, present only
when a drafter ran a verify round for the request, on the non-streaming body and on the
chunk that carries ``finish_reason``; and the same greedy text with prompt lookup on and
off."""

from __future__ import annotations

import json

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
PROMPT = "alpha beta gamma delta " * 12  # its last words occurred before: lookup drafts
DRAFT = {"draft_n", "draft_n_accepted", "draft_rounds", "draft_kind"}


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    on = Server(["--model", str(tiny_checkpoint), "--prompt-lookup", "on", "--metrics"])
    off = Server(["--model", str(tiny_checkpoint), "--prompt-lookup", "off"])
    yield on, off
    on.stop()
    off.stop()


def post(server, path, **body):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        return client.post(path, json={"max_tokens": 24, "temperature": 0,
                                       "cache_prompt": False, **body})


def events(text):
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def test_a_drafted_completion_carries_the_draft_timings(servers):
    on, off = servers
    body = post(on, "/v1/completions", prompt=PROMPT).json()
    timings = body["timings"]
    assert timings["draft_kind"] == "prompt-lookup" and timings["draft_rounds"] >= 1
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert {"prompt_n", "predicted_n", "predicted_per_second"} <= set(timings)
    plain = post(off, "/v1/completions", prompt=PROMPT).json()
    assert "timings" not in plain
    assert body["choices"][0]["text"] == plain["choices"][0]["text"]


def test_streamed_timings_ride_only_the_finishing_chunk(servers):
    on, _ = servers
    chunks = events(post(on, "/v1/completions", prompt=PROMPT, stream=True).text)
    finishing = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
    middle = [c for c in chunks if c not in finishing]
    assert len(finishing) == 1 and DRAFT <= set(finishing[0]["timings"])
    assert all("timings" not in c for c in middle)


def test_native_completion_timings_gain_the_draft_counters(servers):
    on, off = servers
    native = post(on, "/completion", prompt=PROMPT, n_predict=24).json()
    assert DRAFT <= set(native["timings"]) and native["timings"]["draft_rounds"] >= 1
    plain = post(off, "/completion", prompt=PROMPT, n_predict=24).json()
    assert not DRAFT & set(plain["timings"])
    assert native["content"] == plain["content"]


def test_a_drafted_response_carries_the_draft_timings(servers):
    on, off = servers
    body = {"input": PROMPT, "max_output_tokens": 48, "temperature": 0}
    with httpx.Client(base_url=on.base_url, timeout=120) as client:
        drafted = client.post("/v1/responses", json=body).json()
        streamed = events(client.post("/v1/responses", json={**body, "stream": True}).text)
    assert DRAFT <= set(drafted["timings"]) and drafted["timings"]["draft_rounds"] >= 1
    timed = [e for e in streamed if "timings" in e]
    assert len(timed) == 1 and DRAFT <= set(timed[0]["timings"])
    with httpx.Client(base_url=off.base_url, timeout=120) as client:
        plain = client.post("/v1/responses", json=body).json()
    assert "timings" not in plain
    assert drafted["output"][-1]["content"] == plain["output"][-1]["content"]


def test_metrics_and_health_count_the_verify_rounds(servers):
    from prometheus_client.parser import text_string_to_metric_families

    on, _ = servers
    post(on, "/v1/completions", prompt=PROMPT)
    with httpx.Client(base_url=on.base_url, timeout=60) as client:
        text = client.get("/metrics").text
        health = client.get("/health").json()["observability"]
    values = {s.name: s.value for f in text_string_to_metric_families(text)
              for s in f.samples}
    assert values["mlxcel_draft_rounds_total"] >= 1
    assert 0 < values["mlxcel_draft_accepted_total"] <= values["mlxcel_draft_tokens_total"]
    assert health["draft_rounds"] == values["mlxcel_draft_rounds_total"]


# -- constrained and penalised rows, per-request draft limits -----------------------------

WORDS = "alpha beta gamma delta alpha beta gamma delta"  # a constraint that copies the prompt
SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "enum": [WORDS]}},
          "required": ["text"]}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]
CHAT = [{"role": "user", "content": PROMPT}]
MIXED = [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 80, "response_format": {
        "type": "json_schema", "json_schema": {"name": "words", "schema": SCHEMA}}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 80, "tools": TOOLS,
                              "tool_choice": "required"}),
    ("/completion", {"prompt": PROMPT, "n_predict": 24, "repeat_penalty": 1.05,
                     "frequency_penalty": 0.05, "logit_bias": [[7, 1.5]]}),
    ("/v1/completions", {"prompt": PROMPT}),
]


def answer(body):
    """What a body generated: text, or a chat message's content and tool calls."""
    if "content" in body:
        return body["content"]
    choice = body["choices"][0]
    if "text" in choice:
        return choice["text"]
    message = choice["message"]
    calls = [c["function"] for c in message.get("tool_calls") or []]  # ids are random
    return message.get("content"), calls


def all_at_once(server, requests):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: post(server, r[0], **r[1]).json(), requests))


def test_constrained_and_penalised_rows_draft_beside_plain_ones_and_match(servers):
    """A JSON-schema row, a forced tool call, a penalised row and a plain one sent
    together: the same greedy answers as without speculation, and the forced tool call,
    penalised and plain rows drafted. (The JSON row's first tokens, ``{"text"``, are in
    no earlier text: a row drafts from its second token on, and lookup backs it off
    before its words begin.)"""
    on, off = servers
    fast, plain = all_at_once(on, MIXED), all_at_once(off, MIXED)
    assert [answer(b) for b in fast] == [answer(b) for b in plain]
    for body in fast[1:]:
        assert body["timings"]["draft_rounds"] >= 1, body
    calls = fast[1]["choices"][0]["message"]["tool_calls"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"text": WORDS}
    assert json.loads(fast[0]["choices"][0]["message"]["content"]) == {"text": WORDS}


@pytest.mark.parametrize("path", ["/v1/completions", "/completion", "/v1/chat/completions"])
def test_per_request_n_max_switches_drafting_off_or_caps_it(servers, path):
    on, _ = servers
    body = {"messages": CHAT} if path == "/v1/chat/completions" else {"prompt": PROMPT}
    none = post(on, path, **body, **{"speculative.n_max": 0}).json()
    assert not DRAFT & set(none.get("timings", {}))
    capped = post(on, path, **body, **{"speculative.n_max": 2}).json()["timings"]
    assert capped["draft_rounds"] >= 1 and capped["draft_n"] <= 2 * capped["draft_rounds"]
    bad = post(on, path, **body, **{"speculative.n_min": -1})
    assert bad.status_code == 400 and "speculative.n_min" in bad.text
