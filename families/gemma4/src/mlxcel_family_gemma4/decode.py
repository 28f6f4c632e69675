"""Gemma 4's call body, ``call:NAME{key:value,...}``, read into a JSON object's text.

The template's ``format_argument`` writes a string between ``<|"|>`` delimiters (anything
may be inside, ``}``, ``,`` and markers included), a boolean as ``true``/``false``, null as
``null``, an object as ``{key:value,...}`` (keys bare, or between ``<|"|>``), an array as
``[value,...]`` and a number as Python prints it; that grammar is read back here, so a
value's type comes from how it is written. Where the spelling is ambiguous, a bare word,
the request's tool schema decides: a bare value of a top-level parameter whose schema
allows only ``string`` stays its text (``zip:02139`` -> ``"02139"``, ``code:5`` ->
``"5"``); elsewhere a bare JSON number or literal (Python's ``True``/``False``/``None``
too) is that value, keeping the model's spelling, and any other bare word is a string.

mlx-lm's ``tool_parsers/gemma4`` decoder is not used: it quotes keys with a regex that
misses keys after a space or with a ``-``, fails on a bare word or ``True`` (``json.loads``
of the rewritten text), and costs ~2 s to import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

STR = '<|"|>'
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
NAME = re.compile(r"[\w.\-/]+")
_LITERALS = {"true": "true", "false": "false", "null": "null", "True": "true",
             "False": "false", "None": "null"}
_SPACE = " \t\r\n"


class CallSyntaxError(ValueError):
    """A call's body does not read as ``call:NAME{...}``; the message says why."""


def string_parameters(tools: Iterable[Any]) -> dict[str, frozenset[str]]:
    """Per function name, its top-level parameters whose schema allows only ``string``."""
    out: dict[str, frozenset[str]] = {}
    for tool in tools:
        definition = getattr(tool, "definition", tool)
        if not isinstance(definition, dict):
            continue
        fn = definition.get("function", definition)
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = frozenset(k for k, v in (props or {}).items()
                                        if _types(v) == {"string"})
    return out


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else {k for k in kind or () if isinstance(k, str)}
    for branch in (*schema.get("anyOf", ()), *schema.get("oneOf", ())):
        found |= _types(branch)
    return found


def decode_calls(body: str, strings: dict[str, frozenset[str]]) -> list[tuple[str, str]]:
    """Every ``call:NAME{...}`` in ``body`` (whitespace between them), as (name, JSON
    object text); ``strings``: ``string_parameters`` of the request's tools."""
    calls, pos = [], _skip(body, 0)
    if pos == len(body):
        raise CallSyntaxError("a tool call with no function")
    while pos < len(body):
        if not body.startswith("call:", pos):
            raise CallSyntaxError(f"expected 'call:NAME{{' at {body[pos:pos + 20]!r}")
        brace = body.find("{", pos)
        name = body[pos + 5:brace].strip() if brace >= 0 else ""
        if not NAME.fullmatch(name):
            raise CallSyntaxError(f"{body[pos + 5:pos + 45]!r} is not 'NAME{{'")
        try:
            arguments, pos = Reader(body, strings.get(name, frozenset())).object(brace, True)
        except CallSyntaxError:
            raise
        except (IndexError, ValueError, RecursionError):  # ran off the end, or too deep
            raise CallSyntaxError(f"{name}: the arguments are cut off or too deep") from None
        calls.append((name, arguments))
        pos = _skip(body, pos)
    return calls


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _SPACE:
        pos += 1
    return pos


class Reader:
    """Reads values from ``text``; each method returns (JSON text, position after)."""

    def __init__(self, text: str, strings: frozenset[str]) -> None:
        self.text, self.strings = text, strings

    def object(self, pos: int, top: bool = False) -> tuple[str, int]:
        pairs, pos = [], _skip(self.text, pos + 1)
        while self.text[pos] != "}":
            key, pos = self.key(pos)
            value, pos = self.value(pos, top and key in self.strings)
            pairs.append(f"{_dump(key)}: {value}")
            pos = self.after_item(pos, "}")
        return "{" + ", ".join(pairs) + "}", pos + 1

    def array(self, pos: int) -> tuple[str, int]:
        items, pos = [], _skip(self.text, pos + 1)
        while self.text[pos] != "]":
            value, pos = self.value(pos)
            items.append(value)
            pos = self.after_item(pos, "]")
        return "[" + ", ".join(items) + "]", pos + 1

    def after_item(self, pos: int, close: str) -> int:
        """Past the ``,`` after an item (a trailing one too), or at ``close``."""
        pos = _skip(self.text, pos)
        if self.text[pos] == ",":
            return _skip(self.text, pos + 1)
        if self.text[pos] != close:
            raise CallSyntaxError(f"expected ',' or '{close}' at {self.text[pos:pos + 20]!r}")
        return pos

    def key(self, pos: int) -> tuple[str, int]:
        """A key, bare or between ``<|"|>``, and the position after its ``:``."""
        if self.text.startswith(STR, pos):
            key, pos = self.string(pos)
            pos = _skip(self.text, pos)
            if self.text[pos] != ":":
                raise CallSyntaxError(f"the key {key!r} has no ':'")
            return key, pos + 1
        colon = self.text.index(":", pos)
        key = self.text[pos:colon].strip()
        if not key or any(ch in key for ch in '{}[],<>"'):
            raise CallSyntaxError(f"{self.text[pos:colon][:20]!r} is not a key")
        return key, colon + 1

    def string(self, pos: int) -> tuple[str, int]:
        end = self.text.find(STR, pos + len(STR))
        if end < 0:
            raise IndexError("a string left open")
        return self.text[pos + len(STR):end], end + len(STR)

    def value(self, pos: int, as_string: bool = False) -> tuple[str, int]:
        pos = _skip(self.text, pos)
        if self.text.startswith(STR, pos):
            text, pos = self.string(pos)
            return _dump(text), pos
        if self.text[pos] == "{":
            return self.object(pos)
        if self.text[pos] == "[":
            return self.array(pos)
        end = pos
        while self.text[end] not in ",}]":
            end += 1
        word = self.text[pos:end].strip()
        if not word or ":" in word or "{" in word or "[" in word:  # a ',' is missing
            raise CallSyntaxError(f"{self.text[pos:pos + 20]!r} is not a value")
        return _scalar(word, as_string), end


def _scalar(word: str, as_string: bool) -> str:
    if as_string:
        return _dump(word)
    if word in _LITERALS:
        return _LITERALS[word]
    return word if NUMBER.fullmatch(word) else _dump(word)


def _dump(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
