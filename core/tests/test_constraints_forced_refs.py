"""Forced tool calls over parameters that ``$ref`` their own definitions (issue #27 M7):
pydantic writes ``#/$defs/...``, which the call schema's wrapper used to break."""

from __future__ import annotations

import json

import jsonschema
import pytest
from apphelpers import forced_answers
from mlxcel.lazy import resolve
from mlxcel.plugins import load_plugins
from mlxcel.toolcalls.forced import call_schema
from mlxcel.types.messages import Tool

# what pydantic's model_json_schema() writes for a model with a nested model and an enum
PYDANTIC = {
    "$defs": {"Unit": {"enum": ["C", "F"], "title": "Unit", "type": "string"},
              "Place": {"properties": {"city": {"maxLength": 10, "title": "City",
                                                "type": "string"}},
                        "required": ["city"], "title": "Place", "type": "object"}},
    "properties": {"place": {"$ref": "#/$defs/Place"}, "unit": {"$ref": "#/$defs/Unit"}},
    "required": ["place", "unit"], "title": "Weather", "type": "object"}
OTHER = {"type": "object", "properties": {"unit": {"$ref": "#/definitions/U"}},
         "required": ["unit"], "definitions": {"U": {"const": "K"}}}


def _tools(*params: dict) -> tuple[Tool, ...]:
    names = ("get_weather", "get_other")
    return tuple(Tool(name=n, definition={"type": "function", "function": {
        "name": n, "parameters": p}}) for n, p in zip(names, params, strict=False))


@pytest.mark.parametrize("count", [1, 2])
def test_the_call_schema_accepts_exactly_the_tools_own_arguments(count):
    params = (PYDANTIC, OTHER)[:count]
    schema = call_schema(_tools(*params))
    good = {"name": "get_weather", "arguments": {"place": {"city": "Oslo"}, "unit": "C"}}
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "arguments": {"place": {"city": "Oslo"}, "unit": "K"}},
                            schema)
    assert PYDANTIC["properties"]["place"] == {"$ref": "#/$defs/Place"}, "not mutated"


def test_a_forced_call_with_local_refs_compiles_and_holds(tiny_checkpoint):
    fmt = load_plugins().tool_formats.get("hermes")
    tools = _tools(PYDANTIC, OTHER)
    tok, outputs = forced_answers(tiny_checkpoint, resolve(fmt.grammar)(tools, "required"), 300, "r")
    for ids, last in outputs:
        assert last.finish_reason == "stop"
        parser = resolve(fmt.parser)(tools)
        parser.feed(tok.decode(ids, skip_special=False))
        (call,) = parser.finish().calls
        expected = {"get_weather": PYDANTIC, "get_other": OTHER}[call.name]
        jsonschema.validate(json.loads(call.arguments), expected)
