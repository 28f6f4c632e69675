"""End to end: the real mlxcel-server process, the real openai SDK, streaming and not."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something."}]


def test_chat_non_streaming(sdk):
    r = sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert isinstance(r.choices[0].message.content, str)


def test_chat_streaming_matches_non_streaming(sdk):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    whole = sdk.chat.completions.create(**kw).choices[0].message.content
    chunks = list(sdk.chat.completions.create(**kw, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole


def test_completions_streaming_and_not(sdk):
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    whole = sdk.completions.create(**kw)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    parts = list(sdk.completions.create(**kw, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text


def test_models_and_errors_through_the_sdk(sdk, server):
    assert [m.id for m in sdk.models.list().data] == [server.base_url and
                                                        sdk.models.list().data[0].id]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=[], max_tokens=5)
    assert "messages" in info.value.message
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_client_disconnect_cancels_generation(server):
    headers = {"Authorization": "Bearer k-e2e"}
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 100000, "ignore_eos": True}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()  # kept referenced: dropping it would close the connection
            for line in lines:
                if '"content"' in line:
                    break
            busy = http.get("/health").json()["batch"]["active_sequences"]
        assert busy == 1, server.log()[-3000:]
        deadline = time.time() + 10
        while time.time() < deadline:
            health = http.get("/health").json()
            if health["batch"]["active_sequences"] == 0:
                break
            time.sleep(0.05)
        assert health["batch"]["active_sequences"] == 0
        assert health["observability"]["total_decode_tokens"] < 100000
        # and the server still serves
        r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200


def test_request_log_line_has_route_status_and_tokens(server, sdk):
    sdk.completions.create(model="tiny", prompt="log me", max_tokens=3,
                           extra_body={"ignore_eos": True})
    time.sleep(0.3)
    lines = [ln for ln in server.log().splitlines() if "route=/v1/completions" in ln]
    assert lines and "status=200" in lines[-1] and "completion_tokens=3" in lines[-1]
    assert "request_id=" in lines[-1] and "ms=" in lines[-1]


def test_prompt_cache_hit_reported_through_the_sdk(sdk, server):
    system = {"role": "system", "content": "Shared context for every turn. " * 20}
    kw = dict(model="tiny", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    first = sdk.chat.completions.create(messages=[system, {"role": "user", "content": "a"}],
                                        **kw)
    second = sdk.chat.completions.create(messages=[system, {"role": "user", "content": "b"}],
                                         **kw)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 16
    stats = httpx.get(server.base_url + "/v1/cache/stats",
                      headers={"Authorization": "Bearer k-e2e"}).json()
    assert stats["hits"] >= 1


def test_tool_call_round_trip_through_the_sdk(sdk):
    """A forced call, its result sent back, and the next turn: what an agent does."""
    tools = [{"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {
            "tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}}}]
    messages = [{"role": "user", "content": "What time is it?"}]
    first = sdk.chat.completions.create(model="tiny", messages=messages, tools=tools,
                                        tool_choice="required", max_tokens=200, seed=1)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments)["tz"] in ("UTC", "CET")
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    second = sdk.chat.completions.create(model="tiny", messages=messages, tools=tools,
                                         max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
