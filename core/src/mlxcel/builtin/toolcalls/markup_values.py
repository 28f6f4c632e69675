"""Argument values of the markup formats, typed by the request's tool schema.

The spec's rule for formats whose bodies are not JSON (GLM-4.7, LongCat-Flash, MiniMax):
a parameter the schema types as a string keeps the model's text verbatim; any other value
is parsed as JSON, or as a loose literal (``True``/``False``/``None`` as Python writes
them, numbers with leading zeros or a ``+`` where the schema asks for a number), and keeps
its text when it parses as neither. Their templates print strings as they are and every
other value as JSON, so this reverses what the template wrote.

A parameter typed as a string *and* something else (``["string", "null"]``, an ``anyOf``)
takes the parsed value only when its JSON type is one the schema allows, so ``"null"``
there is null and ``"007"`` stays a string; ``nullable: true`` allows null too.

Two cases are the rule every bare-text format shares (``mlxcel.toolcalls.values``, which
the Qwen3-Coder plugin reads by as well): a null spelling (``null``, ``None``, ``NULL``,
``Null``) is null unless the schema allows a string and not null; and a parameter the
schema does not describe (no ``parameters``, no ``properties`` entry, or one without a
type) is the non-string JSON value its text spells (or Python's spelling of one), else
its text verbatim, a string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlxcel.toolcalls.kit import MarkupError
from mlxcel.toolcalls.values import (
    NO_VALUE,
    json_type,
    literal_value,
    reads_as_null,
    untyped_value,
)

_NAME = re.compile(r"[\w.\-:/@]+")


def parameter_schemas(tools: Any) -> dict[str, dict]:
    """Each tool's name -> its parameters' JSON schema (tools without one are left out).
    ``tools``: ``mlxcel.types.messages.Tool``s, or their wire dicts."""
    out: dict[str, dict] = {}
    for tool in tools or ():
        definition = getattr(tool, "definition", tool)
        if not isinstance(definition, dict):
            continue
        function = definition.get("function", definition)
        if not isinstance(function, dict):
            continue
        name = getattr(tool, "name", None) or function.get("name")
        params = function.get("parameters")
        if isinstance(name, str) and isinstance(params, dict):
            out[name] = params
    return out


def property_schema(schema: Any, key: str) -> dict | None:
    """The schema of an object's ``key``: its property, else ``additionalProperties``."""
    if not isinstance(schema, dict):
        return None
    properties = schema.get("properties")
    if isinstance(properties, dict) and isinstance(properties.get(key), dict):
        return properties[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def item_schema(schema: Any, position: int) -> dict | None:
    """The schema of an array's item at ``position`` (``prefixItems``, then ``items``)."""
    if not isinstance(schema, dict):
        return None
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and position < len(prefix) and isinstance(prefix[position],
                                                                          dict):
        return prefix[position]
    items = schema.get("items")
    return items if isinstance(items, dict) else None


def types_of(schema: Any) -> frozenset[str] | None:
    """The JSON types a schema allows (``type``, ``enum``, ``const``, ``anyOf``/``oneOf``/
    ``allOf``, ``nullable: true``); None when it does not say (then any value goes)."""
    if not isinstance(schema, dict):
        return None
    out: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        out.add(declared)
    elif isinstance(declared, list):
        out.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    values = [*(enum if isinstance(enum, list) else ()),
              *([schema["const"]] if "const" in schema else ())]
    out.update(json_type(value) for value in values)
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or ():
            branch_types = types_of(branch)
            if branch_types is None:
                return None
            out |= branch_types
    if out and schema.get("nullable") is True:
        out.add("null")
    return frozenset(out) or None


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's value from the text the model wrote for it (the module's rule)."""
    types = types_of(schema)
    if types is None:
        return untyped_value(text)
    if types <= {"string"}:
        return text
    if reads_as_null(text, types):
        return None
    value = literal_value(text, types)
    if value is NO_VALUE or isinstance(value, str):
        return text
    kind = json_type(value)
    if "string" in types and not _allowed(kind, types):
        return text
    if kind == "number" and "integer" in types and "number" not in types \
            and value.is_integer():
        return int(value)
    return value


def _allowed(kind: str, types: frozenset[str]) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def arguments_json(arguments: dict[str, Any]) -> str:
    """Decoded arguments as the JSON object text a response carries (``ValueError`` if
    a value has no JSON form, which the parser reports as a ``CallError``)."""
    return json.dumps(arguments, ensure_ascii=False, allow_nan=False)


def json_object_text(text: str) -> str:
    """A JSON body's text, stripped and otherwise verbatim (key order, spacing, number
    spelling are the model's); ``MarkupError`` unless it is one JSON object."""
    body = text.strip()
    try:
        value = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        raise MarkupError("the arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise MarkupError("the arguments are not a JSON object")
    return body


def call_name(text: str) -> str:
    """A function name as written (surrounding whitespace aside); ``MarkupError`` when it
    is empty or holds what no name holds (spaces, brackets, quotes)."""
    name = text.strip()
    if not _NAME.fullmatch(name):
        raise MarkupError(f"{name[:40]!r} is not a function name")
    return name


def skip_space(text: str, pos: int) -> int:
    """The first position from ``pos`` that is not whitespace (or the end)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def unquote(text: str) -> str:
    """``"x"`` or ``'x'`` -> ``x``; other text stripped."""
    s = text.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        return s[1:-1]
    return s
