"""A Qwen3-Coder parameter value, text between ``<parameter=KEY>`` tags, as JSON text.

The XML format writes every value as bare text, so its JSON type comes from the request's
tool schema for that parameter:

- the schema's types are its ``type`` (a name or a list of names), the types of every
  branch of ``anyOf`` / ``oneOf`` / ``allOf``, ``nullable: true`` (adds null), and, with no
  ``type``, the JSON types of its ``enum`` / ``const`` values;
- null and a parameter the schema does not type follow the rules every bare-text format
  shares (``mlxcel.toolcalls.values``): ``null``, ``None``, ``NULL`` or ``Null`` is null
  unless the schema allows a string and not null (so ``None`` for ``["integer", "null"]``
  or an ``anyOf`` with a null branch is null, as Qwen3.5's template prints a None
  argument); a parameter the schema does not declare, or declares without any type, is
  the non-string JSON value its text spells (``7``, ``true``, ``{"a": 1}``, Python's
  ``True``/``None``/literal containers), else its text, a string;
- other types are tried in the order boolean, integer, number, object, array; the first
  that reads the text wins, and otherwise the text is a string, verbatim;
- boolean reads ``true`` / ``false`` in any letter case and nothing else (``yes``, ``1``
  and ``on`` stay strings: the model wrote a word, not a flag); integer reads a JSON
  number whose value is whole (``7``, ``7.0``, ``1e3``); number reads any JSON number;
  object and array read JSON, or failing that a Python literal (single quotes, ``True``,
  ``None``), whose value must be of that type;
- a value that is standard JSON for what it was read as is kept as the model spelled it
  (``2.50``, an object's key order and spacing); any other is written out afresh.

A string is never stripped: a string-typed value is exactly what the model wrote. Other
types ignore surrounding whitespace. When nothing fits (``"yes"`` for a boolean) the text
stays a string rather than being dropped or guessed, so the tool sees what the model said.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable
from typing import Any

from mlxcel.toolcalls.values import is_null, reads_as_null, untyped_value

STRING = frozenset({"string"})
ORDER = ("null", "boolean", "integer", "number", "object", "array")
# Non-standard spellings some clients send, to their JSON Schema names.
ALIASES = {
    "str": "string", "text": "string", "enum": "string",
    "int": "integer", "long": "integer", "float": "number", "double": "number",
    "bool": "boolean", "dict": "object", "map": "object", "list": "array", "none": "null",
}
_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (dict, "object"), (list, "array"), (type(None), "null"))


def properties(tools: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Each tool's ``parameters.properties`` by function name (``tools``:
    ``mlxcel.types.messages.Tool``s, or their wire dicts)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        definition = getattr(tool, "definition", tool)
        function = definition.get("function", definition) if isinstance(definition, dict) \
            else {}
        params = function.get("parameters") if isinstance(function, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        name = getattr(tool, "name", None) or function.get("name")
        if isinstance(name, str):
            out[name] = props if isinstance(props, dict) else {}
    return out


def schema_types(schema: Any, depth: int = 0) -> frozenset[str]:
    """The JSON types ``schema`` allows (empty: it says nothing about the type)."""
    if not isinstance(schema, dict) or depth > 8:
        return frozenset()
    kind = schema.get("type")
    names = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    found = {ALIASES.get(str(n).strip().lower(), str(n).strip().lower()) for n in names}
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or ():
            found |= schema_types(branch, depth + 1)
    if not found:
        values = [*(schema.get("enum") or ()), *([schema["const"]] if "const" in schema else [])]
        found |= {_json_type(v) for v in values}
    if schema.get("nullable") is True:
        found.add("null")
    return frozenset(found)


def to_json(text: str, types: frozenset[str]) -> str:
    """The JSON text of value ``text`` under ``types`` (the module docstring's rules;
    empty ``types``: the schema does not type it)."""
    stripped = text.strip()
    if not types:
        value = untyped_value(text)
        return json.dumps(text, ensure_ascii=False) if isinstance(value, str) \
            else _spelled(stripped, value)
    if types != STRING:
        if reads_as_null(stripped, types):
            return "null"
        for kind in ORDER:
            if kind in types and (value := _READERS[kind](stripped)) is not _NO:
                return _spelled(stripped, value)
    return json.dumps(text, ensure_ascii=False)


def _spelled(text: str, value: Any) -> str:
    """The model's own text where it is JSON for exactly ``value``, so its key order,
    spacing and number spelling survive (the spec keeps a model's JSON verbatim); else
    ``value`` written out (``True`` -> ``true``, ``7.0`` for an integer -> ``7``)."""
    written = json.dumps(value, ensure_ascii=False)
    strict = _strict(text)
    return text if strict is not _NO and json.dumps(strict, ensure_ascii=False) == written \
        else written


def _strict(text: str) -> Any:
    """``text`` as standard JSON (no NaN or Infinity, no raw control characters)."""
    try:
        return json.loads(text, parse_constant=_reject)
    except (ValueError, RecursionError):
        return _NO


def _reject(name: str) -> Any:
    raise ValueError(name)


_NO = object()


def _json_type(value: Any) -> str:
    """The JSON type of an ``enum`` / ``const`` value (bool before int: True is an int)."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "string")


def _null(text: str) -> Any:
    return None if is_null(text) else _NO


def _boolean(text: str) -> Any:
    return {"true": True, "false": False}.get(text.lower(), _NO)


def _number(text: str) -> Any:
    value = _strict(text)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        return _NO
    return value


def _integer(text: str) -> Any:
    value = _number(text)
    if isinstance(value, float):
        return int(value) if value.is_integer() else _NO
    return value


def _structured(kinds: tuple[type, ...]) -> Any:
    """A reader of JSON, else of a Python literal, whose value is one of ``kinds``."""
    def read(text: str) -> Any:
        for load in (lambda t: json.loads(t, strict=False, parse_constant=_reject),
                     ast.literal_eval):
            try:
                value = load(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, kinds) and _is_json(value):
                return list(value) if isinstance(value, tuple) else value
        return _NO
    return read


def _is_json(value: Any) -> bool:
    """A literal_eval result that JSON can hold (no sets, bytes, complex numbers)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


_READERS = {"null": _null, "boolean": _boolean, "integer": _integer, "number": _number,
            "object": _structured((dict,)), "array": _structured((list, tuple))}
