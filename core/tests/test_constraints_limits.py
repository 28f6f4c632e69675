"""Schema limits and refusals (400s that never quote the schema), and the keywords the
grammar does not enforce, checked against outlines-core so the explanation stays true."""

from __future__ import annotations

import json
import pathlib

import msgspec
import pytest
from mlxcel.engine.constraints import (
    MAX_DEPTH,
    MAX_REFS,
    MAX_SCHEMA_BYTES,
    ConstraintCompiler,
    OutlinesBackend,
)
from mlxcel.errors import ConstraintTooComplex, InvalidRequest, UnsupportedSchema
from mlxcel.types.constraints import JsonSchemaConstraint

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPLANATION = ROOT / "docs" / "explanation" / "structured-output.md"
MARKER = "zq_private_field_7731"  # must never show in an error message


def _nested(depth: int) -> dict:
    """A schema whose JSON document nests ``depth`` levels (an object property takes
    two: its object and the ``properties`` map), each level a required property."""
    node: dict = {"enum": [1], "title": MARKER} if depth % 2 == 0 else {"type": "integer"}
    for _ in range((depth - 1) // 2):
        node = {"type": "object", "properties": {MARKER: node}, "required": [MARKER]}
    return node


def _arrays(depth: int) -> dict:
    node: dict = {"type": "integer", "title": MARKER}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


def _ref_chain(length: int) -> dict:
    names = [f"{MARKER}{i}" for i in range(length)]
    defs = {n: {"type": "object", "properties": {"x": {"$ref": f"#/$defs/{names[i + 1]}"}},
                "required": ["x"]} for i, n in enumerate(names[:-1])}
    return {"$defs": {**defs, names[-1]: {"type": "integer"}}, "$ref": f"#/$defs/{names[0]}"}


LINKED_LIST = {"$defs": {"node": {"type": "object", "properties": {
    MARKER: {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
    "required": [MARKER, "next"]}}, "$ref": "#/$defs/node"}


def _refs(count: int) -> dict:
    return {"$defs": {"n": {"type": "integer"}}, "type": "object",
            "properties": {f"{MARKER}{i}": {"$ref": "#/$defs/n"} for i in range(count)}}


def _sized(size: int) -> JsonSchemaConstraint:
    """A schema whose canonical text is exactly ``size`` bytes."""
    base = JsonSchemaConstraint.from_schema({"type": "string", "description": ""})
    return JsonSchemaConstraint.from_schema(
        {"type": "string", "description": "x" * (size - len(base.schema))})


REFUSED = [  # (name, constraint, error class, what the message says)
    ("too large", _sized(MAX_SCHEMA_BYTES + 1), ConstraintTooComplex, "64 KiB"),
    ("too deep", JsonSchemaConstraint.from_schema(_nested(MAX_DEPTH + 1)),
     ConstraintTooComplex, "deeper than 32"),
    ("too deep to decode", JsonSchemaConstraint(schema="[" * 20000 + "]" * 20000),
     ConstraintTooComplex, "deeper than 32"),
    ("too many refs", JsonSchemaConstraint.from_schema(_refs(MAX_REFS + 1)),
     ConstraintTooComplex, "64 `$ref`"),
    ("not", JsonSchemaConstraint.from_schema(
        {"type": "object", "properties": {MARKER: {"not": {"type": "string"}}}}),
     UnsupportedSchema, "`not`"),
    ("if/then", JsonSchemaConstraint.from_schema(
        {"if": {"title": MARKER}, "then": {"type": "integer"}}), UnsupportedSchema, "`if`"),
    ("else alone", JsonSchemaConstraint.from_schema(
        {"anyOf": [{"else": {"type": "integer"}, "title": MARKER}]}), UnsupportedSchema,
     "`else`"),
    ("false", JsonSchemaConstraint.from_schema(False), UnsupportedSchema, "matches no output"),
    ("not an object", JsonSchemaConstraint.from_schema([MARKER]), UnsupportedSchema,
     "object or a boolean"),
    ("not JSON", JsonSchemaConstraint(schema='{"' + MARKER), UnsupportedSchema, "not valid"),
    ("unknown format", JsonSchemaConstraint.from_schema(
        {"type": "string", "format": "ipv4", "title": MARKER}), UnsupportedSchema, "format"),
    ("allOf of two", JsonSchemaConstraint.from_schema(
        {"allOf": [{"type": "integer", "title": MARKER}, {"type": "string"}]}),
     UnsupportedSchema, "`allOf`"),
    ("recursion under a required property", JsonSchemaConstraint.from_schema(LINKED_LIST),
     UnsupportedSchema, "recursive"),
    ("exponential nesting", JsonSchemaConstraint.from_schema(_arrays(20)),
     ConstraintTooComplex, "too large to compile"),
    ("free-form depth", JsonSchemaConstraint.from_schema({"type": "object", "depth": 40}),
     ConstraintTooComplex, "too large to compile"),
    ("ref chain", JsonSchemaConstraint.from_schema(_ref_chain(10)), ConstraintTooComplex,
     "deeper than 8"),
    ("unsupported structure", JsonSchemaConstraint.from_schema(
        {"type": "object", "patternProperties": {MARKER: {"type": "integer"}},
         "additionalProperties": False}), UnsupportedSchema, "not supported"),
]


@pytest.mark.parametrize("name,constraint,error,says", REFUSED, ids=[r[0] for r in REFUSED])
def test_each_refusal_is_a_400_that_does_not_echo_the_schema(tmp_path, vocabulary, name,
                                                             constraint, error, says):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    with pytest.raises(error) as caught:
        compiler.submit(constraint)  # refused on the caller's thread, before any compile
    exc = caught.value
    assert isinstance(exc, InvalidRequest) and exc.status == 400
    assert says in exc.message and MARKER not in exc.message and len(exc.message) < 160
    assert "{" not in exc.message and compiler.stats.compiled == 0


@pytest.mark.parametrize("constraint", [
    _sized(MAX_SCHEMA_BYTES), JsonSchemaConstraint.from_schema(_nested(MAX_DEPTH)),
    JsonSchemaConstraint.from_schema(_refs(MAX_REFS)),
    JsonSchemaConstraint.from_schema(_ref_chain(8)),
    JsonSchemaConstraint.from_schema(_arrays(10)),
], ids=["64 KiB", "32 levels", "64 refs", "8 nested refs", "10 nested arrays"])
def test_a_schema_at_each_limit_passes_the_checks(constraint):
    OutlinesBackend().check(constraint)


def test_keywords_are_read_as_keywords_only_where_a_schema_is_expected():
    names = {"type": "object", "properties": {"not": {"type": "integer"},
                                              "if": {"type": "integer"}}}
    data = {"enum": [{"not": 1, "$ref": "x"}] * (MAX_REFS + 1)}
    for schema in (names, data):
        OutlinesBackend().check(JsonSchemaConstraint.from_schema(schema))


def _accepts(vocabulary, tokenizer, schema: dict, instance) -> bool:
    """Whether outlines-core lets the instance (as the tokenizer encodes it) through."""
    defs = {"$defs": schema["$defs"]} if "$defs" in schema else {}
    schema = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped = {**defs, "type": "object", "properties": {"v": schema}, "required": ["v"]}
    compiled = OutlinesBackend().compile(JsonSchemaConstraint.from_schema(wrapped), vocabulary)
    matcher = compiled.matcher()
    text = json.dumps({"v": instance}, separators=(",", ":"), ensure_ascii=False)
    return all(matcher.advance(t) for t in tokenizer.encode(text)) and matcher.accepting


NOT_ENFORCED = [  # (keyword, schema, an instance that violates it)
    ("minimum", {"type": "integer", "minimum": 5}, 3),
    ("maximum", {"type": "number", "maximum": 5}, 9.5),
    ("exclusiveMinimum", {"type": "integer", "exclusiveMinimum": 5}, 5),
    ("exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 5}, 5),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 3),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     [1, 1]),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}},
     [1]),
    ("minProperties", {"type": "object", "additionalProperties": {"type": "integer"},
                       "minProperties": 2}, {"a": 1}),
    ("maxProperties", {"type": "object", "additionalProperties": {"type": "integer"},
                       "maxProperties": 1}, {"a": 1, "b": 2}),
    ("propertyNames", {"type": "object", "additionalProperties": {"type": "integer"},
                       "propertyNames": {"pattern": "^x"}}, {"y": 1}),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"},
                           "b": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
     {"a": 1}),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1),
    ("pattern", {"type": "string", "pattern": "^[\\d]$"}, "\u0663"),  # Unicode \d
    ("format", {"type": "string", "format": "date"}, "2023-02-29"),
    ("maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 2}, "aaaa"),
    ("minLength", {"type": "string", "format": "uuid", "minLength": 40},
     "0a0a0a0a-0a0a-0a0a-0a0a-0a0a0a0a0a0a"),
    ("anyOf", {"type": "object", "properties": {"a": {"type": "integer"}},
               "anyOf": [{"required": ["a"]}]}, {}),
]
ENFORCED = [  # the same probe on what is enforced: (keyword, schema, violating, valid)
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1], [1, 2]),
    ("maxLength", {"type": "string", "maxLength": 3}, "abcd", "abc"),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"]}, {}, {"a": 1}),
    ("format", {"type": "string", "format": "date-time"}, "2023-01-01T10:00:00",
     "2023-01-01T10:00:00Z"),
    ("format", {"type": "string", "format": "date"}, "2023-04-31", "2023-04-30"),
    ("pattern", {"type": "string", "pattern": "^a+$", "maxLength": 2}, "b", "aaa"),
    ("required", _ref_chain(6), {"x": {"x": {"x": {"x": {}}}}},
     {"x": {"x": {"x": {"x": {"x": 7}}}}}),
]


@pytest.mark.parametrize("keyword,schema,instance", NOT_ENFORCED,
                         ids=[f"{k}-{i}" for i, (k, _s, _v) in enumerate(NOT_ENFORCED)])
def test_what_the_explanation_lists_as_not_enforced_is_not(vocabulary, tokenizer, keyword,
                                                            schema, instance):
    assert _accepts(vocabulary, tokenizer, schema, instance)
    assert f"`{keyword}`" in EXPLANATION.read_text(encoding="utf-8")


@pytest.mark.parametrize("keyword,schema,violating,valid", ENFORCED,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ENFORCED)])
def test_the_probe_sees_an_enforced_keyword_refuse_its_violation(vocabulary, tokenizer,
                                                                 keyword, schema, violating,
                                                                 valid):
    assert not _accepts(vocabulary, tokenizer, schema, violating)
    assert _accepts(vocabulary, tokenizer, schema, valid)


def test_the_constraint_keeps_the_clients_key_order():
    text = JsonSchemaConstraint.from_schema(msgspec.json.decode(
        b'{"properties": {"z": {"type": "integer"}, "a": {"type": "integer"}}}')).schema
    assert text.index('"z"') < text.index('"a"')


@pytest.mark.parametrize("node", [
    {"type": "string", "maxLength": 1_000_000_000},
    {"type": "string", "minLength": 5000},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 10**30},
    {"type": "array", "minItems": 2000},
    {"type": "object", "maxProperties": 4096},
    {"type": "string", "pattern": "a{1000000000}"},
    {"type": "string", "pattern": "(?:(?:ab){100}){100}"},
    {"type": "string", "pattern": "x{" + "9" * 5000 + "}"},
], ids=["maxLength", "minLength", "maxItems", "minItems", "maxProperties", "pattern",
        "nested-pattern", "huge-digits"])
def test_every_count_is_bounded_before_anything_is_built(node, monkeypatch):
    """Issue #27 H1: a 40-byte `maxLength` allocated gigabytes; every count (lengths,
    sizes, pattern repeats, nested ones multiplied) is refused at the check, naming its
    keyword, before outlines-core sees the schema."""
    import outlines_core

    def no_building(*args, **kwargs):
        raise AssertionError("built a regex for a refused schema")

    monkeypatch.setattr(outlines_core.json_schema, "build_regex_from_schema", no_building)
    schema = {"type": "object", "properties": {MARKER: node}, "required": [MARKER]}
    with pytest.raises(ConstraintTooComplex) as caught:
        OutlinesBackend().check(JsonSchemaConstraint.from_schema(schema))
    keyword = "pattern" if "pattern" in node else next(k for k in node if k.startswith(
        ("min", "max")))
    assert caught.value.status == 400 and f"`{keyword}`" in caught.value.message
    assert caught.value.param == keyword and MARKER not in caught.value.message


def test_counts_at_the_bound_pass_the_check():
    schema = {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 1024}, "p": {"type": "string",
                                                          "pattern": "(?:a{32}){32}"},
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 1024}}}
    OutlinesBackend().check(JsonSchemaConstraint.from_schema(schema))
