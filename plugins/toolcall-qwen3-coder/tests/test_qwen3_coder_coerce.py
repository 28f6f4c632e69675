"""A parameter's text becomes JSON by the request's schema for it (coerce's rules)."""

from __future__ import annotations

import json

import pytest
from mlxcel_toolcall_qwen3_coder.coerce import properties, schema_types, to_json
from mlxcel_toolcall_qwen3_coder.parser import new_parser
from qwen3_coder_fixtures import tool

INTEGER, NUMBER = {"type": "integer"}, {"type": "number"}
BOOLEAN, STRING = {"type": "boolean"}, {"type": "string"}
INT_OR_STR = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
NULLABLE_INT = {"type": ["integer", "null"]}

CASES = [
    # strings: verbatim, whatever they look like
    (STRING, "7", "7"), (STRING, "null", "null"), (STRING, "true", "true"),
    (STRING, "  padded \n", "  padded \n"), (STRING, '{"a": 1}', '{"a": 1}'),
    (STRING, "", ""),
    # integers: whole JSON numbers only
    (INTEGER, "7", 7), (INTEGER, " -12 ", -12), (INTEGER, "7.0", 7), (INTEGER, "1e3", 1000),
    (INTEGER, "7.5", "7.5"), (INTEGER, "seven", "seven"),
    (INTEGER, "true", "true"), (INTEGER, "NaN", "NaN"),
    # numbers
    (NUMBER, "2.5", 2.5), (NUMBER, "-3", -3), (NUMBER, "1e-3", 0.001), (NUMBER, "0x10", "0x10"),
    # booleans: true/false in any case, and nothing else
    (BOOLEAN, "true", True), (BOOLEAN, "False", False), (BOOLEAN, " TRUE\n", True),
    (BOOLEAN, "yes", "yes"), (BOOLEAN, "1", "1"), (BOOLEAN, "no", "no"),
    # null (JSON's or Python's spelling) unless the schema allows a string and not null
    ({"type": "null"}, "null", None), (NULLABLE_INT, "null", None), (NULLABLE_INT, "4", 4),
    (NULLABLE_INT, "None", None), (NULLABLE_INT, " NULL\n", None), (NULLABLE_INT, "none", "none"),
    ({"type": "string", "nullable": True}, "null", None),
    ({"type": "string", "nullable": True}, "None", None),
    ({"anyOf": [STRING, {"type": "null"}]}, "null", None),
    ({"oneOf": [INTEGER, {"type": "null"}]}, "None", None),
    ({"anyOf": [STRING, {"type": "null"}]}, "nothing", "nothing"),
    (INTEGER, "null", None), (BOOLEAN, "None", None), (STRING, "None", "None"),
    (INT_OR_STR, "null", "null"),
    # anyOf / oneOf: the first non-string type that reads the text, else the string
    (INT_OR_STR, "7", 7), (INT_OR_STR, "7a", "7a"), (INT_OR_STR, "007", "007"),
    ({"oneOf": [NUMBER, BOOLEAN]}, "false", False), ({"oneOf": [NUMBER, BOOLEAN]}, "1.5", 1.5),
    ({"anyOf": [{"type": "array"}, STRING]}, "[1, 2]", [1, 2]),
    ({"anyOf": [{"type": "array"}, STRING]}, "[1, 2", "[1, 2"),
    # objects and arrays: JSON, else a Python literal of the right type
    ({"type": "object"}, '{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
    ({"type": "object"}, "{'a': True, 'b': None}", {"a": True, "b": None}),
    ({"type": "object"}, "[1]", "[1]"), ({"type": "array"}, "{}", "{}"),
    ({"type": "array"}, "(1, 'x')", [1, "x"]), ({"type": "array"}, "{1, 2}", "{1, 2}"),
    ({"type": "object"}, '{"text": "a\tb"}', {"text": "a\tb"}),
    ({"type": "object"}, "__import__('os')", "__import__('os')"),
    # no type: an enum's values say it; else the non-string JSON the text spells, else
    # the text (mlxcel.toolcalls.values); an unknown type name is a string
    ({"enum": [1, 2, 3]}, "2", 2), ({"enum": ["a", "b"]}, "a", "a"), ({"const": True}, "true", True),
    ({"description": "anything"}, "42", 42), ({}, "[1]", [1]), ({}, "True", True),
    ({}, "Paris", "Paris"), ({}, "007", "007"), ({}, '"q"', '"q"'), ({}, " x \n", " x \n"),
    ({"type": "int"}, "5", 5), ({"type": "bool"}, "true", True), ({"type": "uuid"}, "5", "5"),
]


@pytest.mark.parametrize(("schema", "text", "value"), CASES)
def test_a_value_is_read_by_its_schema(schema, text, value):
    got = json.loads(to_json(text, schema_types(schema)))
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("schema", "text", "written"), [
    ({"type": "object"}, ' {"b": 1,\n  "a": [2.50, -0]}\n', '{"b": 1,\n  "a": [2.50, -0]}'),
    (NUMBER, "2.50", "2.50"), (NUMBER, " 1E3 ", "1E3"), (INTEGER, "7.0", "7"),
    (INTEGER, "1e3", "1000"), (BOOLEAN, "True", "true"), (NULLABLE_INT, " null", "null"),
    (NULLABLE_INT, "None", "null"), ({}, " 2.50 ", "2.50"), ({}, "{'a': None}", '{"a": null}'),
    ({"type": "object"}, "{'k': (1, 2)}", '{"k": [1, 2]}'),
    ({"type": "object"}, '{"t": "a\tb"}', '{"t": "a\\tb"}'),
    ({"type": "array"}, "[NaN]", '"[NaN]"'), (STRING, "é\n", '"é\\n"'),
])
def test_json_keeps_the_models_spelling_and_the_rest_is_written_out(schema, text, written):
    assert to_json(text, schema_types(schema)) == written


def test_a_value_nested_too_deep_stays_a_string():
    deep = "[" * 100_000 + "]" * 100_000
    assert json.loads(to_json(deep, schema_types({"type": "array"}))) == deep


@pytest.mark.parametrize(("schema", "types"), [
    ({"type": "integer"}, {"integer"}), ({"type": ["string", "null"]}, {"string", "null"}),
    ({"anyOf": [{"type": "integer"}, {"oneOf": [{"type": "boolean"}]}]},
     {"integer", "boolean"}),
    ({"allOf": [{"type": "object"}]}, {"object"}), ({"enum": ["a", None]}, {"string", "null"}),
    ({"type": "number", "nullable": True}, {"number", "null"}), ({}, set()), ("string", set()),
    ({"$ref": "#/$defs/x"}, set()),
])
def test_the_types_a_schema_allows(schema, types):
    assert schema_types(schema) == types


def test_properties_are_found_by_function_name():
    wire = {"type": "function", "function": {"name": "raw", "parameters": {
        "type": "object", "properties": {"n": INTEGER}}}}
    got = properties([tool("f", a=STRING), wire, tool("g")])
    assert got == {"f": {"a": STRING}, "raw": {"n": INTEGER}, "g": {}}


def test_a_call_coerces_by_its_own_function_schema():
    """Two tools with a parameter of one name and two types: each call reads its own."""
    tools = (tool("a", x=INTEGER), tool("b", x=STRING))
    parser = new_parser(tools)
    text = "".join(f"<tool_call>\n<function={name}>\n<parameter=x>\n7\n</parameter>\n"
                   "</function>\n</tool_call>" for name in ("a", "b", "c"))
    parser.feed(text)
    calls = parser.finish().calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("a", {"x": 7}), ("b", {"x": "7"}), ("c", {"x": 7})]  # c: no schema
