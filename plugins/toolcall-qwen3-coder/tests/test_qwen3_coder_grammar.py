"""The forced-call grammar: from random weights, ``tool_choice`` ``required`` and a named
function give calls the parser reads, of a declared function (named: that one), with the
schema's required parameters and values of its types, ``<tool_call>`` written as the
tokenizer's own token; streamed and whole, through the in-process server."""

from __future__ import annotations

import pytest
from mlxcel.testing import forced_routes as forced
from mlxcel_toolcall_qwen3_coder.grammar import grammar
from mlxcel_toolcall_qwen3_coder.parser import new_parser

WEATHER = forced.WEATHER
ALARM = {"type": "object", "properties": {
    "hour": {"type": "integer"}, "on": {"type": "boolean"},
    "label": {"type": ["string", "null"], "maxLength": 6},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}, "required": ["on", "hour"]}
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
_, TOOLS = forced.function_tools(SCHEMAS)


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
            forced.check_call(SCHEMAS, call.name, call.arguments, set(SCHEMAS))
            seen.add(call.name)
    assert seen == set(SCHEMAS), "six seeds call both tools"


def test_forced_calls_through_the_routes(client):
    first = forced.check_forced_routes(client, SCHEMAS, streamed="get_weather")
    # the name as soon as it is written, the arguments whole when the call ends
    assert len(first) == 2, first


def test_a_tool_that_cannot_be_written_as_tags_is_left_out():
    bad_name = forced.tool("bad<name", {"type": "object", "properties": {}})
    bad_key = forced.tool("bad_key", {"type": "object", "properties": {"a>b": {"type": "string"}},
                               "required": ["a>b"]})
    assert grammar((bad_name, bad_key), "required") is None
    constraint = grammar((bad_name, *TOOLS), "required")
    assert "bad" not in constraint.pattern and "get_weather" in constraint.pattern
    assert constraint.markers == ("<tool_call>", "</tool_call>")


def test_the_grammar_passes_the_conformance_checks(tmp_path, checkpoint):
    forced.check_grammar_compiles(grammar, checkpoint, tmp_path, ALARM)
