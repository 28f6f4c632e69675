"""The forced-call grammar: a regex over the request's tools whose every match the parser
reads as calls of them, each with its required parameters.

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

One or more such blocks, back to back (the text between two blocks would be content), each
calling one of the tools (``tool_choice`` has already narrowed them to the one a named
choice names). ``<tool_call>`` and ``</tool_call>`` are markers: written as the
tokenizer's added tokens where they are, as Qwen3-Coder's tokenizer has them.

- The parameters come in the schema's ``properties`` order (then any ``required`` key
  it does not declare, as text): each required one, each other one or nothing, no
  undeclared one. A tool whose name or a required key cannot be written as a tag (``<``,
  ``>``, a control character in it, or space around it) is left out; with none left
  there is no grammar, and the choice gets the template's directive only.
- A value is read by its schema types (``coerce.schema_types``), as the parser reads it:
  a string (or untyped) value is text with no ``<`` before ``/`` (so it never holds
  ``</parameter>``), at most ``maxLength`` characters when that is given (then with no
  ``<`` at all); ``enum``/``const`` one of the values, written as the parser reads it;
  integer, number (``INTEGER``, ``NUMBER``: bounded digits), boolean and null their JSON
  spelling; an array JSON of its items' grammar; an object a JSON object of scalars and
  flat containers (its keys are not checked). A value of several types is any of theirs;
  any text where one is a string, or a type the parser does not read (the text then
  stays a string).
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.types.constraints import MARKS, RegexConstraint, literal, mark

from mlxcel_toolcall_qwen3_coder.coerce import ORDER, schema_types

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKERS = (OPEN, CLOSE)
MAX_LENGTH = 256  # a longer maxLength is not bounded here (each character is a state)
NESTING = 3  # how deep a schema's arrays are followed; below, values are generic JSON

TEXT = f"(?:[^<{MARKS}]|<+[^</{MARKS}])*"
# at most 19 digits (int64's), 19 decimals and a 3-digit exponent: a longer one is no
# argument a tool takes, and a model stuck on a digit would run to max_tokens
INTEGER = r"-?(?:0|[1-9][0-9]{0,18})"
NUMBER = INTEGER + r"(?:\.[0-9]{1,19})?(?:[eE][+-]?[0-9]{1,3})?"
KNOWN = frozenset(ORDER)  # the types a value is read as; any other text is a string
SCALARS = {"integer": INTEGER, "number": NUMBER, "boolean": "true|false", "null": "null"}
JSON_STRING = '"(?:[^"\\\\<\\x00-\\x1F]|\\\\["\\\\/bfnrt])*"'
_SCALAR = f"(?:{JSON_STRING}|{NUMBER}|true|false|null)"
_FLAT = f"(?:{_SCALAR}|\\[(?:{_SCALAR}(?:,[ ]?{_SCALAR})*)?\\]|" \
    f"\\{{(?:{JSON_STRING}:[ ]?{_SCALAR}(?:,[ ]?{JSON_STRING}:[ ]?{_SCALAR})*)?\\}})"
JSON_OBJECT = f"\\{{[ ]?(?:{JSON_STRING}:[ ]?{_FLAT}(?:,[ ]?{JSON_STRING}:[ ]?{_FLAT})*)?[ ]?\\}}"
JSON_ARRAY = f"\\[(?:{_FLAT}(?:,[ ]?{_FLAT})*)?\\]"


def grammar(tools: tuple[Any, ...], choice: Any) -> RegexConstraint | None:
    """What ``ToolFormat.grammar`` names: the constraint of a forced call of ``tools``."""
    calls = [c for c in (_call(t) for t in tools) if c is not None]
    if not calls:
        return None
    block = f"{mark(0)}\\n(?:{'|'.join(calls)})</function>\\n{mark(1)}"
    return RegexConstraint(pattern=f"(?:{block})+", markers=MARKERS)


def _call(tool: Any) -> str | None:
    """One tool's ``<function=NAME>`` and parameters, or None: it cannot be written."""
    function = tool.definition.get("function") or {}
    params = function.get("parameters") if isinstance(function, dict) else None
    params = params if isinstance(params, dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = params.get("required") if isinstance(params.get("required"), list) else []
    required = [k for k in required if isinstance(k, str)]  # other entries name nothing
    if not _writable(tool.name) or not all(_writable(k) for k in required):
        return None
    parts = [f"<function={literal(tool.name)}>\\n"]
    keys = {**props, **{k: {} for k in required if k not in props}}
    for key, schema in keys.items():
        if _writable(key):
            param = f"<parameter={literal(key)}>\\n(?:{value(schema)})\\n</parameter>\\n"
            parts.append(param if key in required else f"(?:{param})?")
    return "".join(parts)


def _writable(name: Any) -> bool:
    """A name the parser reads back from ``<tag=NAME>`` as itself."""
    return isinstance(name, str) and bool(name) and name == name.strip() \
        and not any(ch in name for ch in "<>\n") and not any(ch < " " for ch in name)


def value(schema: Any) -> str:
    """The text of one parameter's value (the module docstring's rules)."""
    choices = _choices(schema)
    if choices is not None:
        return "|".join(choices)
    types = schema_types(schema)
    if not types or not types <= KNOWN:
        return _text(schema if isinstance(schema, dict) else {})
    return "|".join(json_value(schema, t, NESTING) for t in sorted(types))


def _choices(schema: Any) -> list[str] | None:
    """An ``enum`` / ``const``'s values as the parser reads them (strings verbatim, any
    other as JSON), or None: the schema has neither, or no value can be written."""
    if not isinstance(schema, dict) or not ("enum" in schema or "const" in schema):
        return None
    values = schema["enum"] if isinstance(schema.get("enum"), list) else []
    values = [*values, *([schema["const"]] if "const" in schema else [])]
    texts = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
    kept = [literal(t) for t in dict.fromkeys(texts) if _plain(t)]
    return kept or None


def _plain(text: str) -> bool:
    """Text a value can hold: no ``<`` (a closing tag) and no mark character."""
    return "<" not in text and not any("\x01" <= ch <= "\x08" for ch in text)


def _text(schema: dict) -> str:
    longest = schema.get("maxLength")
    if isinstance(longest, int) and not isinstance(longest, bool) and 0 <= longest <= MAX_LENGTH:
        least = schema.get("minLength")
        least = least if isinstance(least, int) and 0 <= least <= longest else 0
        return f"[^<{MARKS}]{{{least},{longest}}}"
    return TEXT


def json_value(schema: Any, kind: str, depth: int) -> str:
    """A JSON value of type ``kind`` (array items follow ``items`` ``depth`` levels)."""
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "string":
        return JSON_STRING
    if kind == "array" and depth > 0 and isinstance(schema, dict) \
            and isinstance(schema.get("items"), dict):
        item = _json_any(schema["items"], depth - 1)
        return f"\\[(?:(?:{item})(?:,[ ]?(?:{item}))*)?\\]"
    return JSON_ARRAY if kind == "array" else JSON_OBJECT


def _json_any(schema: dict, depth: int) -> str:
    """Any JSON value ``schema`` allows (a generic one where it says nothing)."""
    values = [*(schema.get("enum") if isinstance(schema.get("enum"), list) else ()),
              *([schema["const"]] if "const" in schema else [])]
    kept = [literal(t) for t in (json.dumps(v, ensure_ascii=False) for v in values)
            if _plain(t)]
    if kept:
        return "|".join(kept)
    types = schema_types(schema)
    return "|".join(json_value(schema, t, depth) for t in sorted(types)) \
        if types and types <= KNOWN | {"string"} else _FLAT
