"""End to end in process: the app serves the tiny Gemma 4 checkpoint through this family,
reports a tool parser, answers a chat request with tools, streamed and whole, and a
Gemma 4 answer with a thought channel and a call becomes reasoning, content and a call."""

from __future__ import annotations

import json

import pytest
from gemma4_fixtures import TOOLS, WEATHER

TOOL_DEFS = [t.definition for t in TOOLS]


@pytest.fixture(scope="module")
def client(gemma4_checkpoint):
    from mlxcel.testing.engine import app_client

    with app_client(gemma4_checkpoint) as c:
        yield c


def test_health_reports_a_tool_parser(client):
    assert client.get("/health").json()["tool_call_parser"] == "mlxcel"


def test_a_chat_request_with_tools_is_answered(client):
    body = {"model": "tiny", "max_tokens": 8, "temperature": 0, "tools": TOOL_DEFS,
            "messages": [{"role": "user", "content": "weather in Paris?"}]}
    whole = client.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    content = choice["message"].get("content") or ""
    assert "<|tool_call>" not in content and "<|channel>" not in content
    streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.status_code == 200
    frames = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert frames and frames[-1]["choices"][0]["finish_reason"] is not None


def test_an_answer_splits_into_reasoning_content_and_a_call(gemma4_checkpoint):
    """The chat layer's answer machine with the loaded checkpoint's reasoning markers and
    tool format, fed a Gemma 4 answer token by token as the engine emits it (special
    tokens' text kept, with their spans)."""
    from mlxcel.chat.output import OutputMachine, merge
    from mlxcel.lazy import resolve
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.types import ContentDelta, GenerationEvent, ReasoningDelta

    plugins = load_plugins()
    ckpt = load_checkpoint(str(gemma4_checkpoint), plugins.families,
                           tool_formats=plugins.tool_formats)
    tok = ckpt.tokenizer
    machine = OutputMachine(reasoning=ckpt.reasoning,
                            tool_parser=resolve(ckpt.tool_format.parser)(TOOLS),
                            special_texts=tok.special_texts.values())
    answer = "<|channel>thought\nweather, then Paris<channel|>Checking." + WEATHER
    ids, deltas = tok.encode(answer), []
    specials = set(tok.special_texts)
    for n, token in enumerate(ids):
        text = tok.decode([token], skip_special=False)
        deltas += machine.feed(GenerationEvent(
            text=text, specials=((0, len(text)),) if token in specials else (),
            token_ids=(token,), finish_reason="tool_calls" if n == len(ids) - 1 else None))
    merged = merge(deltas)
    reasoning = "".join(d.text for d in merged if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in merged if isinstance(d, ContentDelta))
    assert reasoning == "weather, then Paris"  # the channel label is not reasoning
    assert content == "Checking."
    names = [getattr(d, "name", None) for d in merged if type(d).__name__ == "ToolCallStart"]
    assert names == ["get_weather"]
    args = "".join(d.text for d in merged if type(d).__name__ == "ToolCallArguments")
    assert json.loads(args) == {"city": "Paris", "days": 3}
