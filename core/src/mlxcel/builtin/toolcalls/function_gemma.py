"""FunctionGemma: ``<start_function_call>call:NAME{key:VALUE,...}<end_function_call>``.

The template's ``format_argument`` writes a string between ``<escape>`` tokens, a boolean
as ``true``/``false``, an object as ``{key:value,...}`` (keys bare, or escaped), an array
as ``[value,...]`` and anything else as Python prints it; that grammar is read back here,
so a value's type comes from how it is written, not from the schema. A bare word that is
no JSON literal stays a string (``True``/``None`` read as Python's). mlx-lm's
``function_gemma`` decoder is not used: it stops at the first ``}`` (a nested object or a
string holding ``}`` breaks it), reads nested values as strings, accepts only ``\\w``
names and returns only the first call.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mlxcel.builtin.toolcalls.markup_values import arguments_json, call_name, skip_space
from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

OPEN, CLOSE = "<start_function_call>", "<end_function_call>"
ESCAPE = "<escape>"
_LITERALS = {"True": True, "False": False, "None": None}


def decode(body: str) -> Decoded:
    """``call:NAME{...}``, the object running to the end of the body."""
    text = body.strip()
    if not text.startswith("call:"):
        raise MarkupError("the call does not start with 'call:'")
    brace = text.find("{")
    if brace < 0:
        raise MarkupError("the call has no arguments object")
    name = call_name(text[5:brace])
    try:
        arguments, end = _object(text, brace)
    except MarkupError:
        raise
    except (IndexError, ValueError):  # ran off the end, or an <escape> left open
        raise MarkupError(f"{name}: the arguments are cut off") from None
    if text[end:].strip():
        raise MarkupError(f"{name}: text after the arguments: {text[end:end + 20]!r}")
    return Decoded(name, arguments_json(arguments))


def _items(text: str, pos: int, close: str, item: Any) -> tuple[list[Any], int]:
    """The ``,``-separated items of the bracket at ``pos`` up to ``close``, each read by
    ``item(text, pos)``; the items and where the bracket ends."""
    out: list[Any] = []
    pos = skip_space(text, pos + 1)
    if text[pos] == close:
        return out, pos + 1
    while True:
        value, pos = item(text, pos)
        out.append(value)
        pos = skip_space(text, pos)
        if text[pos] == close:
            return out, pos + 1
        if text[pos] != ",":
            raise MarkupError(f"expected ',' or '{close}' at {text[pos:pos + 20]!r}")
        pos += 1


def _object(text: str, pos: int) -> tuple[dict[str, Any], int]:
    """``{key:value,...}`` starting at ``pos``; the object and where it ends."""
    pairs, end = _items(text, pos, "}", _pair)
    return dict(pairs), end


def _pair(text: str, pos: int) -> tuple[tuple[str, Any], int]:
    key, pos = _key(text, skip_space(text, pos))
    value, pos = _value(text, pos)
    return (key, value), pos


def _key(text: str, pos: int) -> tuple[str, int]:
    """A key (bare or escaped) and the position after its ``:``."""
    if text.startswith(ESCAPE, pos):
        end = text.index(ESCAPE, pos + len(ESCAPE))
        key, pos = text[pos + len(ESCAPE):end], skip_space(text, end + len(ESCAPE))
        if text[pos] != ":":
            raise MarkupError(f"the key {key!r} has no ':'")
        return key, pos + 1
    colon = text.index(":", pos)
    key = text[pos:colon].strip()
    if not key or any(ch in key for ch in "{}[],"):
        raise MarkupError(f"{text[pos:colon][:20]!r} is not a key")
    return key, colon + 1


def _value(text: str, pos: int) -> tuple[Any, int]:
    """One value at ``pos`` (after spaces): escaped string, object, array or bare
    scalar."""
    pos = skip_space(text, pos)
    if text.startswith(ESCAPE, pos):
        end = text.index(ESCAPE, pos + len(ESCAPE))
        return text[pos + len(ESCAPE):end], end + len(ESCAPE)
    if text[pos] == "{":
        return _object(text, pos)
    if text[pos] == "[":
        return _items(text, pos, "]", _value)
    end = pos
    while end < len(text) and text[end] not in ",}]":
        end += 1
    return _scalar(text[pos:end]), end


def _scalar(raw: str) -> Any:
    word = raw.strip()
    if word in _LITERALS:
        return _LITERALS[word]
    try:
        value = json.loads(word, parse_constant=_not_json)
    except ValueError:
        return word
    if isinstance(value, (dict, list)) or (isinstance(value, float) and not math.isfinite(value)):
        return word
    return value


def _not_json(name: str) -> Any:
    raise ValueError(name)


def new_parser(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one FunctionGemma answer (values are typed by their spelling)."""
    return BlockParser(Blocks(unit=(OPEN, CLOSE), decode=decode))
