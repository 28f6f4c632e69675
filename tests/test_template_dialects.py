"""One conversation, every dialect: the chat layer adapts it to the model's template the
same way whether it came as OpenAI chat, Responses, Anthropic Messages or llama-server's
``/apply-template``, so each count endpoint and each answer's usage agree.

The in-process app serves a tiny checkpoint that carries a real template
(tests/chat_templates) whose caps need adapting: a null content (Qwen3), 9-character ids
(Mistral Nemo), no system role or tools (Gemma 2), ``thinking`` and object arguments
(gpt-oss)."""

from __future__ import annotations

import json
import shutil

import pytest
from mlxcel.testing import build_checkpoint
from mlxcel.testing.engine import app_client
from template_fixtures import HERE, SOURCES

SYSTEM = "You are a weather agent."
ASK = "What is the weather in Lisbon?"
CALL_ID = "toolu_01A09q90qw90lq917835lq9"
ARGS = {"city": "Lisbon"}
RESULT = "Sunny, 24 degrees"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

OPENAI = {"model": "tiny", "messages": [
    {"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": CALL_ID, "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather.", "parameters": SCHEMA}}]}
ANTHROPIC = {"model": "tiny", "system": SYSTEM, "messages": [
    {"role": "user", "content": ASK},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": ARGS}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": CALL_ID, "content": RESULT}]}],
    "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": SCHEMA}]}
RESPONSES = {"model": "tiny", "input": [
    {"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK},
    {"type": "function_call", "call_id": CALL_ID, "name": "get_weather",
     "arguments": json.dumps(ARGS)},
    {"type": "function_call_output", "call_id": CALL_ID, "output": RESULT}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather.",
               "parameters": SCHEMA}]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("dialects") / "ckpt", template="chatml")


@pytest.mark.parametrize("name", ["qwen3-0.6b-2505", "mistral-nemo", "gemma-2", "gpt-oss",
                                  "llama-3.1"])
def test_every_dialect_counts_the_same_prompt(base, tmp_path, name):
    ckpt = tmp_path / name
    shutil.copytree(base, ckpt)
    shutil.copy(HERE / SOURCES[name]["file"], ckpt / "chat_template.jinja")
    with app_client(ckpt) as client:
        applied = client.post("/apply-template", json=OPENAI)
        assert applied.status_code == 200, applied.text
        prompt = applied.json()["prompt"]
        assert ASK in prompt and RESULT in prompt and "Lisbon" in prompt
        tokens = client.post("/tokenize", json={"content": prompt, "add_special": False,
                                                "parse_special": True}).json()["tokens"]
        chat = client.post("/v1/chat/completions", json={**OPENAI, "max_tokens": 1})
        assert chat.status_code == 200, chat.text
        anthropic = client.post("/v1/messages/count_tokens", json=ANTHROPIC)
        assert anthropic.status_code == 200, anthropic.text
        responses = client.post("/v1/responses/input_tokens", json=RESPONSES)
        assert responses.status_code == 200, responses.text
    counts = {"apply-template": len(tokens), "chat": chat.json()["usage"]["prompt_tokens"],
              "anthropic": anthropic.json()["input_tokens"],
              "responses": responses.json()["input_tokens"]}
    assert len(set(counts.values())) == 1, counts
