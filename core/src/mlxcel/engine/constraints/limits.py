"""Limits a constraint must pass before it is compiled, each a 400 that never quotes it.

The grammar build grows with the schema and runs in native code that cannot be stopped,
so the cheap checks come first: the serialized size (64 KiB), the nesting of the document
(32 levels) and the number of ``$ref`` (64), as the spec sets them. Keywords the grammar
engine cannot enforce and would not refuse by itself are refused here by name
(``REJECTED``); those it ignores but that cannot make an output wrong by much are
documented instead (docs/explanation/structured-output.md). The walk follows schema
keywords only, so a property named ``not`` or an ``enum`` value holding ``"$ref"`` is data.
A regex constraint's pattern is bounded in bytes (``MAX_PATTERN_BYTES``, the bound a JSON
schema's regex is held to), each counted repetition (``{n}``, ``{m,n}``) to
``MAX_REPEAT`` (the regex engine builds every counted copy in memory, unbounded), and its
markers in number (``check_markers``). A JSON schema is held to the same ``MAX_REPEAT``
in every count it gives (``COUNTS``: string lengths, array sizes, property counts) and in
its ``pattern`` regexes: the index holds one state per counted position, so a 40-byte
``{"maxLength": 1000000000}`` would otherwise allocate until the process dies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from mlxcel.engine.constraints.marks import check_markers
from mlxcel.errors import ConstraintTooComplex, UnsupportedSchema
from mlxcel.types.constraints import JsonSchemaConstraint, RegexConstraint

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_REFS = 64
MAX_PATTERN_BYTES = 1 << 20
MAX_REPEAT = 1024
# keywords whose meaning the grammar cannot express: refused, never silently dropped
REJECTED = ("not", "if", "then", "else")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
DEFINITIONS = ("$defs", "definitions")
_SCHEMA_MAPS = ("properties", "patternProperties", *DEFINITIONS, "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "additionalItems", "items", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", *REJECTED)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def check_json_schema(constraint: JsonSchemaConstraint) -> Any:
    """Raise the limit's error, or return the decoded schema (an object or a boolean)."""
    if len(constraint.schema.encode()) > MAX_SCHEMA_BYTES:
        raise ConstraintTooComplex(
            f"the JSON schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB serialized")
    too_deep = ConstraintTooComplex(f"the JSON schema nests deeper than {MAX_DEPTH} levels")
    try:
        schema = msgspec.json.decode(constraint.schema)
    except RecursionError:
        raise too_deep from None
    except msgspec.DecodeError:
        raise UnsupportedSchema("the JSON schema is not valid JSON") from None
    if _depth(schema) > MAX_DEPTH:
        raise too_deep
    if not isinstance(schema, dict | bool):
        raise UnsupportedSchema("a JSON schema must be an object or a boolean")
    if schema is False:
        raise UnsupportedSchema("the JSON schema `false` matches no output")
    refs = 0
    for node in subschemas(schema):
        for keyword in REJECTED:
            if keyword in node:
                raise UnsupportedSchema(f"the JSON schema keyword `{keyword}` is not supported")
        refs += "$ref" in node
        check_counts(node)
    if refs > MAX_REFS:
        raise ConstraintTooComplex(f"the JSON schema has more than {MAX_REFS} `$ref`")
    return schema


def check_counts(node: dict) -> None:
    """Refuse a schema object whose counts or ``pattern`` repeats pass ``MAX_REPEAT``,
    naming the keyword (never its value's context)."""
    for keyword in COUNTS:
        value = node.get(keyword)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and value > MAX_REPEAT:
            raise ConstraintTooComplex(f"the JSON schema's `{keyword}` is larger than "
                                       f"{MAX_REPEAT}; bound it to {MAX_REPEAT} or less",
                                       param=keyword)
    pattern = node.get("pattern")
    if isinstance(pattern, str) and max(repeats(pattern), default=0) > MAX_REPEAT:
        raise ConstraintTooComplex(f"the JSON schema's `pattern` repeats a part more than "
                                   f"{MAX_REPEAT} times", param="pattern")


def check_regex(constraint: RegexConstraint) -> None:
    """Raise the limit's error for a regex constraint."""
    if len(constraint.pattern.encode()) > MAX_PATTERN_BYTES:
        raise ConstraintTooComplex(f"{constraint.subject} is larger than "
                                   f"{MAX_PATTERN_BYTES >> 20} MiB; declare fewer or "
                                   "smaller tools")
    if not constraint.pattern:
        raise UnsupportedSchema(f"{constraint.subject} is empty")
    if max(repeats(constraint.pattern), default=0) > MAX_REPEAT:
        raise ConstraintTooComplex(f"{constraint.subject} repeats a part more than "
                                   f"{MAX_REPEAT} times")
    check_markers(constraint.markers)


def repeats(pattern: str) -> Iterator[int]:
    """The counts of a pattern's counted repetitions (``{n}``, ``{m,}``, ``{m,n}``),
    outside character classes and escapes, each multiplied by the counts of the groups
    around it (``(a{100}){100}`` repeats ``a`` 10000 times)."""
    frames, last, i = [1], 1, 0  # frames: the largest repeat inside each open group
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            last, i = 1, i + 2
            continue
        if ch == "[":
            end = _class_end(pattern, i)
            last, i = 1, end + 1
            continue
        if ch == "(":
            frames.append(1)
        elif ch == ")" and len(frames) > 1:
            last = frames.pop()
            frames[-1] = max(frames[-1], last)
        elif ch == "{":
            end = pattern.find("}", i)
            counts = [_count(c) for c in pattern[i + 1:end].split(",")] if end > 0 else []
            counts = [c for c in counts if c is not None]
            if counts:
                last *= max(counts)
                frames[-1] = max(frames[-1], last)
                yield last
                i = end
        else:
            last = 1
        i += 1


def _count(text: str) -> int | None:
    """A repeat count; past nine digits, one over any bound (``int`` refuses huge
    strings)."""
    text = text.strip()
    if not text.isdigit():
        return None
    return int(text) if len(text) <= 9 else 1 << 40


def _class_end(pattern: str, i: int) -> int:
    """The index of the ``]`` closing the character class opened at ``i``."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j


def _depth(value: Any) -> int:
    """Nesting of objects and arrays in a JSON document, without recursion (a scalar is
    0): a hostile document must not exhaust Python's stack before it is refused."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node \
            if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def children(node: dict) -> Iterator[tuple[str, str | None, Any]]:
    """The direct subschemas of a schema object: (keyword, name in its map or None,
    subschema)."""
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                yield key, name, child
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield key, None, node[key]
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for child in node[key]:
                yield key, None, child


def subschemas(schema: Any, definitions: bool = True) -> Iterator[dict]:
    """Every schema object reachable through schema keywords (not through ``$ref``),
    ``schema`` first; without ``definitions``, the ``$defs`` / ``definitions`` maps are
    skipped (what only a ``$ref`` reaches)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node
        stack.extend(child for key, _name, child in children(node)
                     if definitions or key not in DEFINITIONS)
