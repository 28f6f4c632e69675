"""Argument values of the markup formats, typed by the request's tool schema.

The spec's rule for formats whose bodies are not JSON (GLM-4.7, LongCat-Flash, MiniMax):
a parameter the schema types as a string keeps the model's text verbatim; any other value
is parsed as JSON, or as a loose literal (``True``/``False``/``None`` as Python writes
them, numbers with leading zeros or a ``+`` where the schema asks for a number), and keeps
its text when it parses as neither. Their templates print strings as they are and every
other value as JSON, so this reverses what the template wrote.

A parameter typed as a string *and* something else (``["string", "null"]``, an ``anyOf``)
takes the parsed value only when its JSON type is one the schema allows, so ``"null"``
there is null and ``"007"`` stays a string. A parameter the schema does not describe is
parsed like a non-string one.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from mlxcel.builtin.toolcalls.markup_stream import MarkupError

_LOOSE = {"True": True, "False": False, "None": None, "TRUE": True, "FALSE": False,
          "NULL": None, "Null": None}
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[\w.\-:/@]+")
_NOTHING = object()


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
    ``allOf``); None when it does not say (then any value goes)."""
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
    return frozenset(out) or None


def json_type(value: Any) -> str:
    """The JSON schema type of a Python value parsed from JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's value from the text the model wrote for it (the module's rule)."""
    types = types_of(schema)
    if types is not None and types <= {"string"}:
        return text
    value = _parse(text, types)
    if value is _NOTHING or isinstance(value, str):
        return text
    kind = json_type(value)
    if types is not None and "string" in types and not _allowed(kind, types):
        return text
    if kind == "number" and types is not None and "integer" in types \
            and "number" not in types and value.is_integer():
        return int(value)
    return value


def _allowed(kind: str, types: frozenset[str]) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(text: str, types: frozenset[str] | None) -> Any:
    """JSON, then a loose literal, then a Python literal container; ``_NOTHING`` if none."""
    s = text.strip()
    if not s:
        return _NOTHING
    try:
        return _jsonable(json.loads(s, parse_constant=_no_constants))  # 1e999 is no value
    except (ValueError, RecursionError):
        pass
    if s in _LOOSE:
        return _LOOSE[s]
    if types is not None and types & {"integer", "number"}:
        if _INT.fullmatch(s):
            return int(s)
        if "number" in types and _FLOAT.fullmatch(s):
            return _jsonable(float(s))
    if s[0] in "[{(":
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return _NOTHING
        return _jsonable(value)
    return _NOTHING


def _jsonable(value: Any) -> Any:
    """A Python literal as a JSON value (tuples as lists), or ``_NOTHING`` when it has no
    JSON form (a set, bytes, a complex or non-finite number, a non-string key)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NOTHING
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        return _NOTHING if any(v is _NOTHING for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        pairs = {k: _jsonable(v) for k, v in value.items()}
        return _NOTHING if any(v is _NOTHING for v in pairs.values()) else pairs
    return _NOTHING


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
