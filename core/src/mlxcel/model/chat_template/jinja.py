"""The Jinja environment chat templates render in: transformers' own, plus what real
templates need that it lacks.

Hugging Face templates are written against transformers' ``apply_chat_template``, so that
is the reference: ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, its ``tojson``
(``ensure_ascii=False``, ``indent``, ``separators``, ``sort_keys``; keys in insertion
order), ``raise_exception`` and ``strftime_now``, and its ``{% generation %}`` block
(assistant-mask tracking, which renders its body unchanged).

Templates written for other servers read variables transformers never sets; they get
what llama.cpp gives them, unless the request sets them itself: ``functions`` (the
tools as indented JSON, ``""`` without tools: firefunction-v2), ``datetime`` (the
current time, which it needs), and ``builtin_tools`` (Llama 3.1's built-in
tools among the request's functions, by name; only when there are some).

The sandbox is jinja2's, with one relaxation: a template may call ``append``, ``extend``,
``insert``, ``pop``, ``remove``, ``update``, ``setdefault``, ``add`` and ``discard`` on
lists, dicts and sets it made itself (Kimi K2's and others' templates build lists as
they go), never on the values it was given (the messages, tools and variables of a
render), so rendering cannot change a request. Every other rule of the sandbox holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import SandboxedEnvironment, modifies_known_mutable


class TemplateRefusal(jinja2.exceptions.TemplateError):
    """The template's own ``raise_exception(message)``: it refuses these messages."""


def raise_exception(message: str) -> None:
    raise TemplateRefusal(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: no HTML escaping, its keyword options, keys as given."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


LEGACY = ("functions", "datetime", "builtin_tools")
# Llama 3.1's built-in tools, as llama.cpp recognises them among a request's functions.
LLAMA_BUILTIN_TOOLS = ("wolfram_alpha", "web_search", "brave_search", "python",
                       "code_interpreter")


def legacy(reads: frozenset[str], tools: list[dict[str, Any]],
           given: dict[str, Any]) -> dict[str, Any]:
    """The legacy variables a template ``reads`` that ``given`` does not set."""
    want = reads - given.keys()
    if not want:
        return {}
    now = datetime.now()
    out: dict[str, Any] = {}
    if "functions" in want:
        out["functions"] = json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""
    if "datetime" in want:
        out["datetime"] = now.strftime("%b %d %Y %H:%M:%S GMT")
    names = [(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)]
    if "builtin_tools" in want and (builtin := [n for n in names if n in LLAMA_BUILTIN_TOOLS]):
        out["builtin_tools"] = builtin
    return out


class GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's
    tokens with it; rendering ignores the tags and keeps the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "update", "setdefault",
                      "add", "discard"})
_given: ContextVar[frozenset[int]] = ContextVar("mlxcel_template_inputs", default=frozenset())


def _containers(value: Any, found: set[int], depth: int = 0) -> None:
    if depth > 64 or not isinstance(value, (list, dict, set, tuple)):
        return
    found.add(id(value))
    items = value.values() if isinstance(value, dict) else value
    for item in items:
        _containers(item, found, depth + 1)


@contextmanager
def given(context: dict[str, Any]) -> Iterator[None]:
    """While a render of ``context`` runs, its containers are read-only to the template."""
    found: set[int] = set()
    _containers(list(context.values()), found)
    token = _given.set(frozenset(found))
    try:
        yield
    finally:
        _given.reset(token)


class TemplateSandbox(SandboxedEnvironment):
    """jinja2's sandbox; mutating methods only on containers the template made."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if not super().is_safe_attribute(obj, attr, value):
            return False
        if not modifies_known_mutable(obj, attr):
            return True
        return attr in MUTATORS and id(obj) not in _given.get()


def environment() -> TemplateSandbox:
    env = TemplateSandbox(trim_blocks=True, lstrip_blocks=True,
                          extensions=[loopcontrols, GenerationBlock])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def syntax_error(exc: jinja2.TemplateSyntaxError) -> str:
    """One line naming the construct and where it is."""
    message = " ".join(str(exc.message or exc).split())
    return f"line {exc.lineno}: {message}" if exc.lineno else message
