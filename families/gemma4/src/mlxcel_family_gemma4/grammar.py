"""The forced-call grammar: a regex over the request's tools whose every match the parser
(``decode``) reads as calls of them, each with its required arguments.

    <|tool_call>call:NAME{key:value,...}<tool_call|>

One or more such blocks, back to back as the template writes them, each calling one of
the tools (``tool_choice`` has already narrowed them to the one a named choice names).
``<|tool_call>``, ``<tool_call|>`` and the string delimiter ``<|"|>`` are markers:
written as the tokenizer's special tokens, as Gemma 4's tokenizer has them.

- Arguments come in sorted key order (the template's ``dictsort``), each ``required``
  one, each other declared one or nothing, no undeclared one, separated by ``,``. A key
  is bare where the parser reads it back bare, else between ``<|"|>``. A tool whose name
  the parser does not read as a name (``[\\w.\\-/]+``) is left out; with none left there
  is no grammar, and the choice gets the template's directive only.
- A value follows its schema, written as the template's ``format_argument`` writes it:
  a string between ``<|"|>`` (its text never holds ``<|"``, so the string never ends
  early; at most ``maxLength`` characters, then with no ``<``, when that is given); a
  number, an integer (``INTEGER``, ``NUMBER``: bounded digits), ``true``/``false``,
  ``null`` bare; an ``enum``/``const`` one of its values; an array of its items; an
  object of its ``properties`` by the same rules as the arguments (``NESTING`` levels
  deep; below, and for an object without ``properties``, any values under bare keys);
  ``anyOf``/``oneOf`` and a list of types any branch; no type at all any value.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.types.constraints import MARKS, RegexConstraint, literal, mark

from mlxcel_family_gemma4.decode import NAME, STR

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
MARKERS = (OPEN, CLOSE, STR)
QUOTE = mark(2)
MAX_LENGTH = 256  # a longer maxLength is not bounded here (each character is a state)
NESTING = 3  # schema levels followed; below, values are generic
EXACT = 6  # an object of more optional-only keys may end its list with a ","

TEXT = f"(?:[^<{MARKS}]|<+[^<|{MARKS}]|<+\\|[^\"<{MARKS}])*"
# at most 19 digits (int64's), 19 decimals and a 3-digit exponent: a longer one is no
# argument a tool takes, and a model stuck on a digit would run to max_tokens
INTEGER = r"-?(?:0|[1-9][0-9]{0,18})"
NUMBER = INTEGER + r"(?:\.[0-9]{1,19})?(?:[eE][+-]?[0-9]{1,3})?"
SCALARS = {"integer": INTEGER, "number": NUMBER, "boolean": "true|false", "null": "null"}
BARE_KEY = "[A-Za-z_][A-Za-z0-9_]*"
_BAD_KEY = set('{}[],<>":') | {chr(c) for c in range(32)}


def grammar(tools: tuple[Any, ...], choice: Any) -> RegexConstraint | None:
    """What ``ToolFormat.grammar`` names: the constraint of a forced call of ``tools``."""
    calls = [f"{literal(t.name)}\\{{{arguments(_parameters(t), NESTING)}\\}}"
             for t in tools if isinstance(t.name, str) and NAME.fullmatch(t.name)]
    if not calls:
        return None
    block = f"{mark(0)}call:(?:{'|'.join(calls)}){mark(1)}"
    return RegexConstraint(pattern=f"(?:{block})+", markers=MARKERS)


def _parameters(tool: Any) -> dict:
    function = tool.definition.get("function") or {}
    params = function.get("parameters") if isinstance(function, dict) else None
    return params if isinstance(params, dict) else {}


def arguments(schema: dict, depth: int) -> str:
    """The ``key:value,...`` inside an object's braces."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    keys = sorted({*props, *(k for k in required if isinstance(k, str))})
    items = [(f"{key(k)}:(?:{value(props.get(k), depth - 1)})", k in required)
             for k in keys if _quotable(k)]
    return sequence(items)


def sequence(items: list[tuple[str, bool]]) -> str:
    """``items`` (regex, required) in order, each required one present, each other one
    or nothing, separated by ``,``. Before the first required item each optional one is
    ``item,``, after it ``,item``; with none required, the first present item is chosen
    from all of them (EXACT or fewer), or each but the last is ``item,`` (the parser
    takes a trailing ``,``)."""
    first = next((i for i, (_, needed) in enumerate(items) if needed), None)
    if first is not None:
        head = "".join(f"(?:{x},)?" for x, _ in items[:first])
        tail = "".join(f",{x}" if needed else f"(?:,{x})?" for x, needed in items[first + 1:])
        return head + items[first][0] + tail
    if not items:
        return ""
    if len(items) > EXACT:
        return "".join(f"(?:{x},)?" for x, _ in items[:-1]) + f"(?:{items[-1][0]})?"
    starts = [x + "".join(f"(?:,{y})?" for y, _ in items[i + 1:])
              for i, (x, _) in enumerate(items)]
    return f"(?:{'|'.join(starts)})?"


def key(name: str) -> str:
    """A key as the parser reads it back: bare where it can be, else quoted."""
    bare = name == name.strip() and not any(ch in _BAD_KEY for ch in name)
    return literal(name) if bare else f"{QUOTE}{literal(name)}{QUOTE}"


def _quotable(name: Any) -> bool:
    """A key that fits between ``<|"|>`` (no ``<|"`` and no mark character in it)."""
    return isinstance(name, str) and bool(name) and _plain(name)


def _plain(text: str) -> bool:
    return '<|"' not in text and not any("\x01" <= ch <= "\x08" for ch in text)


def value(schema: Any, depth: int) -> str:
    """One value of ``schema`` (the module docstring's rules)."""
    if not isinstance(schema, dict) or depth < 0:
        return generic(1)
    choices = _choices(schema)
    if choices:
        return "|".join(choices)
    nullable = ["null"] if schema.get("nullable") is True else []
    branches = [b for k in ("anyOf", "oneOf") for b in schema.get(k) or ()
                if isinstance(schema.get(k), list)]
    if branches:
        return "|".join([*(f"(?:{value(b, depth - 1)})" for b in branches), *nullable])
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else [k for k in kind or () if isinstance(k, str)] \
        if isinstance(kind, list) else []
    if not kinds:
        return generic(1)
    return "|".join([*(f"(?:{typed(schema, k, depth)})" for k in kinds), *nullable])


def typed(schema: dict, kind: str, depth: int) -> str:
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "string":
        return string(schema)
    if kind == "array":
        items = schema.get("items")
        item = value(items, depth - 1) if isinstance(items, dict) else generic(1)
        return f"\\[(?:(?:{item})(?:,(?:{item}))*)?\\]"
    if kind == "object" and isinstance(schema.get("properties"), dict) and depth > 0:
        return f"\\{{{arguments(schema, depth)}\\}}"
    return generic(1)


def string(schema: dict) -> str:
    longest, least = schema.get("maxLength"), schema.get("minLength")
    if isinstance(longest, int) and not isinstance(longest, bool) and 0 <= longest <= MAX_LENGTH:
        least = least if isinstance(least, int) and 0 <= least <= longest else 0
        return f"{QUOTE}[^<{MARKS}]{{{least},{longest}}}{QUOTE}"
    return f"{QUOTE}{TEXT}{QUOTE}"


def _choices(schema: dict) -> list[str]:
    """An ``enum`` / ``const``'s values as the template writes them (none: neither)."""
    values = [*(schema.get("enum") if isinstance(schema.get("enum"), list) else ()),
              *([schema["const"]] if "const" in schema else [])]
    out = []
    for v in values:
        if isinstance(v, str):
            if _plain(v):
                out.append(f"{QUOTE}{literal(v)}{QUOTE}")
        elif v is None or isinstance(v, bool | int | float):
            out.append(literal(json.dumps(v)))
    return list(dict.fromkeys(out))


def generic(depth: int) -> str:
    """Any value: a scalar, or (``depth`` > 0) an object under bare keys or an array of
    values one level less deep."""
    scalar = f"{QUOTE}{TEXT}{QUOTE}|{NUMBER}|true|false|null"
    if depth <= 0:
        return scalar
    inner = generic(depth - 1)
    return (f"{scalar}|\\{{(?:{BARE_KEY}:(?:{inner})(?:,{BARE_KEY}:(?:{inner}))*)?\\}}"
            f"|\\[(?:(?:{inner})(?:,(?:{inner}))*)?\\]")
