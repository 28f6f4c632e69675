"""Argument values written as bare text: the reading rules every tool format shares.

GLM-4.7, LongCat-Flash, MiniMax M2/M3 and Qwen3-Coder write each argument's value as bare
text between tags; the request's tool schema types it. Where the schema does not settle a
value, every such format reads it by these rules (a format's own module states how it
reads a value the schema does type):

- **Null.** ``null`` (JSON's spelling), ``None`` (Python's: Qwen3-Coder's and Qwen3.5's
  templates print a None argument through Jinja's ``string``), ``NULL`` and ``Null``,
  surrounding whitespace aside, are JSON null wherever the parameter's schema allows null
  (``type: [..., "null"]``, an ``anyOf``/``oneOf`` branch of type null, ``nullable``) or
  allows no string at all; where it allows a string and not null they are that string
  (``reads_as_null``).
- **A parameter the schema does not describe** (the tool has no ``parameters``, its
  ``properties`` have no entry for the name, or the entry gives no type): the text, less
  surrounding whitespace, is the JSON value it spells when that value is a number,
  ``true``/``false``, ``null``, an object or an array; Python's spellings of those read
  too (``True``, ``False``, ``None``, a literal list, tuple or dict of such values). Any
  other text, a JSON string included (its quotes kept), is the value as the model wrote
  it, a string (``untyped_value``). A number JSON cannot hold (``1e999``, ``NaN``) stays
  text.

Why: every one of these templates writes a string argument as it is and any other as JSON
(``tojson``; Qwen3-Coder prints scalars with ``string``), so, with no schema to say which
was meant, a value that spells a non-string JSON value was one. The conformance kit checks
a format against these rules (``mlxcel.testing.conformance.check_text_values``).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Collection
from typing import Any

NULLS = frozenset({"null", "None", "NULL", "Null"})
NO_VALUE: Any = object()  # what ``literal_value`` returns for text that spells no value
_LOOSE = {"True": True, "False": False, "TRUE": True, "FALSE": False,
          **dict.fromkeys(NULLS)}
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")


def is_null(text: str) -> bool:
    """Whether ``text`` spells null (``NULLS``, surrounding whitespace aside)."""
    return text.strip() in NULLS


def reads_as_null(text: str, types: Collection[str] | None) -> bool:
    """Whether a value's ``text`` is JSON null under a schema allowing ``types`` (None or
    empty: the schema does not say): it spells null, and the schema allows null or no
    string (the module's rule)."""
    return is_null(text) and (not types or "null" in types or "string" not in types)


def untyped_value(text: str) -> Any:
    """A value the schema does not describe, from the text the model wrote for it (the
    module's rule): the non-string value it spells, else ``text`` itself."""
    value = literal_value(text)
    return text if value is NO_VALUE or isinstance(value, str) else value


def literal_value(text: str, types: Collection[str] | None = None) -> Any:
    """The value ``text`` spells, or ``NO_VALUE``: JSON, then a Python literal
    (``True``/``False``/``None``, a list, tuple or dict), each only if JSON can hold it.
    Where ``types`` holds ``integer`` or ``number``, a number as people write it reads too
    (``007``, ``+7``, ``.5``)."""
    s = text.strip()
    if not s:
        return NO_VALUE
    try:
        return jsonable(json.loads(s, parse_constant=_no_constants))  # 1e999 is no value
    except (ValueError, RecursionError):
        pass
    if s in _LOOSE:
        return _LOOSE[s]
    if types and {"integer", "number"} & set(types):
        if _INT.fullmatch(s):
            return int(s)
        if "number" in types and _FLOAT.fullmatch(s):
            return jsonable(float(s))
    if s[0] in "[{(":
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return NO_VALUE
        return jsonable(value)
    return NO_VALUE


def jsonable(value: Any) -> Any:
    """A Python literal as a JSON value (tuples as lists), or ``NO_VALUE`` when it has no
    JSON form (a set, bytes, a complex or non-finite number, a non-string key)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else NO_VALUE
    if isinstance(value, (list, tuple)):
        items = [jsonable(v) for v in value]
        return NO_VALUE if any(v is NO_VALUE for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        pairs = {k: jsonable(v) for k, v in value.items()}
        return NO_VALUE if any(v is NO_VALUE for v in pairs.values()) else pairs
    return NO_VALUE


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


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
