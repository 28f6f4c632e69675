"""The forced-call grammar: from random weights, ``tool_choice`` ``required`` and a named
function give calls the parser reads, of a declared function (named: that one), with the
schema's required parameters and values of its types, ``<tool_call>`` written as the
tokenizer's own token; streamed and whole, through the in-process server."""

from __future__ import annotations

import json

import jsonschema
import pytest
from mlxcel.types.messages import Tool
from mlxcel_toolcall_qwen3_coder.grammar import grammar
from mlxcel_toolcall_qwen3_coder.parser import new_parser

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}, "required": ["city", "unit"]}
ALARM = {"type": "object", "properties": {
    "hour": {"type": "integer"}, "on": {"type": "boolean"},
    "label": {"type": ["string", "null"], "maxLength": 6},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}, "required": ["on", "hour"]}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
DEFS = [{"type": "function", "function": {"name": n, "parameters": s}}
        for n, s in SCHEMAS.items()]
TOOLS = tuple(Tool(name=d["function"]["name"], definition=d) for d in DEFS)
CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": DEFS, "max_tokens": 300, "temperature": 1.0}


def tool(name: str, parameters: dict) -> Tool:
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "parameters": parameters}})


def check_call(name: str, arguments: str, allowed: set[str]) -> None:
    assert name in allowed
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.fixture(scope="module")
def checkpoint(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32",
                             template="qwen3_coder")


@pytest.fixture(scope="module")
def client(checkpoint):
    from mlxcel.testing.engine import app_client

    with app_client(checkpoint, parallel=2) as c:
        yield c


def test_the_engine_writes_calls_the_parser_reads_with_the_marker_tokens(checkpoint):
    from mlxcel.testing.conformance import forced_calls

    markers = ("<tool_call>", "</tool_call>")
    seen = set()
    for calls, text in forced_calls(checkpoint, grammar, new_parser, TOOLS, markers):
        assert text.count("<tool_call>") == len(calls)  # one block per call
        for call in calls:
            check_call(call.name, call.arguments, set(SCHEMAS))
            seen.add(call.name)
    assert seen == set(SCHEMAS), "six seeds call both tools"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_yields_a_call_of_a_declared_function(client, seed):
    r = client.post(CHAT, json={**BODY, "tool_choice": "required", "seed": seed})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"]
    for call in choice["message"]["tool_calls"]:
        assert call["type"] == "function" and call["id"].startswith("call_")
        check_call(call["function"]["name"], call["function"]["arguments"], set(SCHEMAS))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_named_choice_yields_that_function(client, name):
    named = {"type": "function", "function": {"name": name}}
    r = client.post(CHAT, json={**BODY, "tool_choice": named, "seed": 4})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    for call in choice["message"]["tool_calls"]:
        check_call(call["function"]["name"], call["function"]["arguments"], {name})


def test_a_streamed_forced_call_leaks_no_markup_and_its_fragments_join(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.post(CHAT, json={**BODY, "tool_choice": named, "seed": 5, "stream": True})
    frames = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: {")]
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == \
        "tool_calls"
    assert not "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    first = [c for c in calls if c["index"] == 0]
    # the name as soon as it is written, the arguments whole when the call ends
    assert first[0]["function"]["name"] == "get_weather" and len(first) == 2
    check_call("get_weather", "".join(c["function"].get("arguments", "") for c in first),
               {"get_weather"})


def test_a_tool_that_cannot_be_written_as_tags_is_left_out():
    bad_name = tool("bad<name", {"type": "object", "properties": {}})
    bad_key = tool("bad_key", {"type": "object", "properties": {"a>b": {"type": "string"}},
                               "required": ["a>b"]})
    assert grammar((bad_name, bad_key), "required") is None
    constraint = grammar((bad_name, *TOOLS), "required")
    assert "bad" not in constraint.pattern and "get_weather" in constraint.pattern
    assert constraint.markers == ("<tool_call>", "</tool_call>")


@pytest.fixture(scope="module")
def vocabulary(checkpoint):
    from mlxcel.engine.constraints import TokenVocabulary
    from mlxcel.model.tokenizer import Tokenizer

    return TokenVocabulary.from_tokenizer(Tokenizer.from_dir(checkpoint))


def test_the_grammar_passes_the_conformance_checks(tmp_path, vocabulary):
    """Odd and 40-deep tool schemas compile; the pattern grows linearly with the tools."""
    from mlxcel.testing.conformance import check_grammar

    check_grammar(grammar, vocabulary, tmp_path, {**ALARM, "properties": {
        **ALARM["properties"], "filters": {"type": "object"},
        "ids": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "mode": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}})
