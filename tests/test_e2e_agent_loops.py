"""Agent loops end to end: the real ``mlxcel-server`` on a tiny checkpoint that carries
Qwen3's own chat template (tests/chat_templates/qwen3-0.6b-2505.jinja, the revision that
reads ``'</think>' in message.content``), four turns of calls and results through the
real ``openai`` and ``anthropic`` SDKs, each turn sending back the assistant message as
the SDK returned it (``content: null`` beside ``tool_calls``; a ``tool_use``-only turn).
Calls are forced, so random weights still make them."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from mlxcel.testing import build_checkpoint
from mlxcel.testing.servers import MlxcelServer as Server

pytestmark = pytest.mark.slow
QWEN3 = Path(__file__).parent / "chat_templates" / "qwen3-0.6b-2505.jinja"
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Lisbon", "Porto", "Madrid"]}}, "required": ["city"]}
OPENAI_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather for a city.",
                    "input_schema": SCHEMA}]
GREEDY = {"temperature": 0.7, "seed": 11}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = build_checkpoint(tmp_path_factory.mktemp("qwen3") / "ckpt", template="chatml")
    (ckpt / "chat_template.jinja").write_text(QWEN3.read_text(encoding="utf-8"),
                                              encoding="utf-8")
    srv = Server(["--model", str(ckpt), "--parallel", "2"])
    yield srv
    srv.stop()


def test_props_show_the_probed_caps(server):
    props = httpx.get(server.base_url + "/props", trust_env=False).json()
    caps = props["chat_template_caps"]
    assert caps["requires_non_null_content"] is True and caps["supports_tool_calls"] is True
    assert caps["supports_system_role"] is True and caps["supports_tools"] is True


def test_openai_four_turn_tool_loop(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    messages: list = [{"role": "system", "content": "You are a weather agent."},
                      {"role": "user", "content": "Compare the weather in three cities."}]
    prompt_tokens = []
    for turn in range(3):
        r = client.chat.completions.create(model="tiny", messages=messages, tools=OPENAI_TOOLS,
                                           tool_choice="required", max_tokens=60, **GREEDY)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        message = choice.message
        assert message.content is None and message.tool_calls
        prompt_tokens.append(r.usage.prompt_tokens)
        messages.append(message)  # as agents do: the SDK's own object, content null
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"turn {turn}: sunny in {args['city']}"})
    last = client.chat.completions.create(model="tiny", messages=messages, tools=OPENAI_TOOLS,
                                          max_tokens=8, extra_body={"ignore_eos": True},
                                          **GREEDY)
    assert last.choices[0].finish_reason in ("length", "stop", "tool_calls")
    prompt_tokens.append(last.usage.prompt_tokens)
    assert prompt_tokens == sorted(prompt_tokens) and len(set(prompt_tokens)) == 4


def test_anthropic_four_turn_tool_loop(server):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0)
    messages: list = [{"role": "user", "content": "Compare the weather in three cities."}]
    counted = []
    for turn in range(3):
        r = client.messages.create(model="tiny", max_tokens=60, system="You are terse.",
                                   messages=messages, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "any"}, extra_body=GREEDY)
        assert r.stop_reason == "tool_use", r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert uses and all(b.type in ("tool_use", "text") for b in r.content)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in uses]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id,
             "content": f"turn {turn}: sunny in {b.input['city']}"} for b in uses]})
        counted.append(r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0))
    last = client.messages.create(model="tiny", max_tokens=8, system="You are terse.",
                                  messages=messages, tools=ANTHROPIC_TOOLS,
                                  extra_body={**GREEDY, "ignore_eos": True})
    assert last.stop_reason in ("max_tokens", "end_turn", "tool_use")
    total = client.messages.count_tokens(model="tiny", system="You are terse.",
                                         messages=messages, tools=ANTHROPIC_TOOLS)
    assert total.input_tokens == last.usage.input_tokens + \
        (last.usage.cache_read_input_tokens or 0)
    assert counted == sorted(counted) and total.input_tokens > counted[-1]
