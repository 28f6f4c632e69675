"""The forced-call grammar: from random weights, ``tool_choice`` ``required`` and a named
function give calls the parser reads, of a declared function (named: that one), with the
schema's required arguments and values of its types, the markers written as Gemma 4's
special tokens; streamed and whole, through the in-process server."""

from __future__ import annotations

import json

import jsonschema
import pytest
from mlxcel.types.messages import Tool
from mlxcel_family_gemma4.grammar import EXACT, grammar, sequence
from mlxcel_family_gemma4.parser import new_parser

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}, "required": ["unit", "city"]}
ALARM = {"type": "object", "properties": {
    "hour": {"type": "integer"}, "on": {"type": "boolean"},
    "at:zone": {"enum": ["UTC", "CET"]},
    "label": {"type": ["string", "null"], "maxLength": 6},
    "opts": {"type": "object", "properties": {"loud": {"type": "boolean"},
                                              "level": {"type": "number"}},
             "required": ["loud"]}},
    "required": ["on", "hour", "at:zone", "opts"]}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
DEFS = [{"type": "function", "function": {"name": n, "parameters": s}}
        for n, s in SCHEMAS.items()]
TOOLS = tuple(Tool(name=d["function"]["name"], definition=d) for d in DEFS)
MARKERS = ("<|tool_call>", "<tool_call|>", '<|"|>')
CHAT = "/v1/chat/completions"
# The family's loop detection stays on: a random model's "5555" inside a value must not
# cut the call short (the engine does not stop a row for a loop inside its constraint).
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": DEFS, "max_tokens": 300, "temperature": 1.0}


def tool(name: str, parameters: dict) -> Tool:
    return Tool(name=name, definition={"type": "function", "function": {
        "name": name, "parameters": parameters}})


def check_call(name: str, arguments: str, allowed: set[str]) -> None:
    assert name in allowed
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.fixture(scope="module")
def client(gemma4_checkpoint):
    from mlxcel.testing.engine import app_client

    with app_client(gemma4_checkpoint, parallel=2) as c:
        yield c


def test_the_engine_writes_calls_the_parser_reads_with_the_special_tokens(gemma4_checkpoint):
    from mlxcel.testing.conformance import forced_calls

    seen = set()
    for calls, _ in forced_calls(gemma4_checkpoint, grammar, new_parser, TOOLS, MARKERS):
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
    assert choice["finish_reason"] == "tool_calls", choice
    for call in choice["message"]["tool_calls"]:
        check_call(call["function"]["name"], call["function"]["arguments"], {name})


def test_a_streamed_forced_call_leaks_no_markup_and_arrives_whole(client):
    named = {"type": "function", "function": {"name": "set_alarm"}}
    r = client.post(CHAT, json={**BODY, "tool_choice": named, "seed": 5, "stream": True})
    frames = [json.loads(line[6:]) for line in r.text.split("\n\n")
              if line.startswith("data: {")]
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    assert [f["choices"][0]["finish_reason"] for f in frames if f["choices"]][-1] == \
        "tool_calls"
    assert not "".join(d.get("content") or "" for d in deltas)
    first = [c for d in deltas for c in d.get("tool_calls", []) if c["index"] == 0]
    assert first[0]["function"]["name"] == "set_alarm"
    check_call("set_alarm", "".join(c["function"].get("arguments", "") for c in first),
               {"set_alarm"})


def test_a_tool_whose_name_the_parser_cannot_read_is_left_out():
    bad = tool("bad{name", {"type": "object", "properties": {}})
    assert grammar((bad,), "required") is None
    constraint = grammar((bad, *TOOLS), "required")
    assert "bad" not in constraint.pattern and constraint.markers == MARKERS


@pytest.mark.parametrize("flags", [(False, False, False), (False, True, False),
                                   (True, False, True), (False,) * (EXACT + 2)])
def test_optional_items_are_separated_once_and_required_ones_kept(flags):
    """Each subset of the optional items (the required ones always in) is one ``,``
    between two items, none before the first; past ``EXACT`` optional-only items, a
    list without the last one ends in ``,`` (the parser takes a trailing comma)."""
    import itertools
    import re

    items = [(chr(97 + i), needed) for i, needed in enumerate(flags)]
    pattern = re.compile(sequence(items))
    optional = [x for x, needed in items if not needed]
    trailing = not any(flags) and len(flags) > EXACT
    for n in range(len(optional) + 1):
        for left_out in itertools.combinations(optional, n):
            kept = [x for x, _ in items if x not in left_out]
            text = ",".join(kept) + ("," if trailing and kept and items[-1][0] in left_out
                                     else "")
            assert pattern.fullmatch(text), (flags, text)
            assert not kept or not pattern.fullmatch("," + text)
    for x, needed in items:
        if needed:
            assert not pattern.fullmatch(",".join(y for y, _ in items if y != x))


@pytest.fixture(scope="module")
def vocabulary(gemma4_checkpoint):
    from mlxcel.engine.constraints import TokenVocabulary
    from mlxcel.model.tokenizer import Tokenizer

    return TokenVocabulary.from_tokenizer(Tokenizer.from_dir(gemma4_checkpoint))


def test_the_grammar_passes_the_conformance_checks(tmp_path, vocabulary):
    """Odd and 40-deep tool schemas compile; the pattern grows linearly with the tools."""
    from mlxcel.testing.conformance import check_grammar

    check_grammar(grammar, vocabulary, tmp_path, {**ALARM, "properties": {
        **ALARM["properties"], "filters": {"type": "object"},
        "ids": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "mode": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}})
