"""Python-syntax calls: ``[get_weather(city="Paris", days=2)]`` (pythonic) and Llama's
built-in ``brave_search.call(query="...")``.

``PyExtent`` finds where a bracketed Python expression ends as its text grows (strings in
either quote, with escapes, and nesting tracked); ``PythonCallParser.read_python`` is the
parser state that waits for it. The finished text is parsed with
Python's own ``ast`` and only literals are taken (``ast.literal_eval``), never evaluated;
``true``/``false``/``null`` are read as JSON's, since templates render nested values as
JSON. Keyword arguments become a JSON object's text, in the order written: these bodies
are not JSON, so there is no model text to keep verbatim.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from mlxcel.toolcalls.json_scan import BracketExtent
from mlxcel.toolcalls.kit import StreamParser

_JSON_NAMES = {"true": True, "false": False, "null": None}


class PyExtent(BracketExtent):
    """The extent of one bracketed Python expression: strings in either quote, and all
    three kinds of bracket (``end``: the index past its closing bracket, -1 before)."""

    __slots__ = ()
    QUOTES = "'\""
    OPENERS = "([{"
    OUTSIDE = re.compile(r"""[\[\](){}'"]""")
    INSIDE = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}


class PythonCallParser(StreamParser):
    """A stream parser whose calls are Python expressions, sent whole once parsed."""

    def python_head(self, head: re.Pattern[str], prefix: re.Pattern[str]
                    ) -> re.Match[str] | bool | None:
        """Whether a call's ``head`` (``[name(``, ``name.call(``) is next, as ``match``
        answers for a marker: its match; None while the text so far could still become
        one (``prefix`` matches it whole); False when it cannot."""
        if m := head.match(self.buf, self.pos):
            return m
        return None if prefix.fullmatch(self.buf, self.pos) and not self.final else False

    def read_python(self, start: int, parse: Callable[[str], Any],
                    then: Callable[[Any], bool]) -> bool:
        """Read the bracketed expression whose bracket is at ``self.pos`` (its text begins
        at ``start``, e.g. a called name before the bracket); once it closes, ``then``
        gets ``parse`` of its text. A ``ValueError`` from ``parse`` breaks the call with
        its message."""
        self._python = (PyExtent(), start, parse, then)
        self.state = self._read_python
        return True

    def _read_python(self) -> bool:
        extent, start, parse, then = self._python
        self.pos = extent.advance(self.buf, self.pos)
        if extent.end < 0:
            return self.wait()
        try:
            parsed = parse(self.buf[start:self.pos])
        except ValueError as exc:
            return self.broken(str(exc))
        return then(parsed)


class _JsonNames(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


def _expression(src: str) -> ast.expr:
    try:
        return ast.parse(src.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError("the call is not Python syntax") from None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("a called name is not a plain (dotted) name")


def _arguments(node: ast.Call) -> str:
    """The keyword arguments of ``node`` as a JSON object's text."""
    if node.args:
        raise ValueError("a call has positional arguments")
    values = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError("a call unpacks **arguments")
        try:
            values[keyword.arg] = ast.literal_eval(_JsonNames().visit(keyword.value))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise ValueError(f"the value of {keyword.arg!r} is not a literal") from None
    try:
        return json.dumps(values, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError("an argument has no JSON form") from None


def call_list(src: str) -> list[tuple[str, str]]:
    """``[f(a=1), g(b="x")]`` as (name, arguments) pairs; ValueError if it is anything
    else (an empty list, a positional argument, a value that is not a literal)."""
    tree = _expression(src)
    if not isinstance(tree, ast.List) or not tree.elts:
        raise ValueError("the calls are not a non-empty list")
    out = []
    for node in tree.elts:
        if not isinstance(node, ast.Call):
            raise ValueError("the list holds something other than a call")
        out.append((_dotted(node.func), _arguments(node)))
    return out


def builtin_call(src: str) -> tuple[str, str]:
    """Llama's ``name.call(k=v, ...)`` as (name, arguments)."""
    node = _expression(src)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "call" and isinstance(node.func.value, ast.Name)):
        raise ValueError("a built-in call is not NAME.call(...)")
    return node.func.value.id, _arguments(node)
