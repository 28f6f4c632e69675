"""Forced tool calls: the JSON schema of "a call of one of these tools", from which a tool
format whose wire form wraps a JSON object in fixed markup builds its ``grammar``.

``tool_choice`` ``required`` (any declared tool) and a named function (the one tool left
after ``tool_choice``) reduce to the same thing here, since the chat layer has already
narrowed the tools to those the model may call.

A tool's parameters may ``$ref`` their own definitions (``#/$defs/...``, as pydantic
writes them), a pointer from the parameters' root. Inside the call schema that root moves,
so each local ``$ref`` is rewritten to point into a copy of the parameters kept under the
call schema's own ``$defs`` (``mlxcel_tool<i>``): outlines-core follows ``$defs`` paths but
not array indexes such as ``anyOf/0``.
"""

from __future__ import annotations

import copy
from typing import Any

from mlxcel.engine.constraints.limits import subschemas

EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


def parameters(tool: Any) -> Any:
    """A tool's arguments schema; a tool that declares none takes an empty object (a
    free-form object would let the model write anything, and compiles slowly)."""
    function = tool.definition.get("function") or {}
    schema = function.get("parameters")
    return schema if isinstance(schema, (dict, bool)) and schema not in ({}, True) else EMPTY


def call_schema(tools: tuple[Any, ...], arguments: str = "arguments") -> dict[str, Any]:
    """``{"name": <a tool's name>, <arguments>: <its parameters>}``, for any of
    ``tools`` (``arguments``: the key the format writes, e.g. Llama 3's
    ``"parameters"``)."""
    defs: dict[str, Any] = {}
    calls = [{"type": "object",
              "properties": {"name": {"const": t.name},
                             arguments: _rehome(parameters(t), f"mlxcel_tool{i}", defs)},
              "required": ["name", arguments], "additionalProperties": False}
             for i, t in enumerate(tools)]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "$defs": defs} if defs else schema


def _rehome(schema: Any, name: str, defs: dict[str, Any]) -> Any:
    """``schema`` with its local ``$ref`` pointing at ``#/$defs/<name>``, where a copy of
    it is added to ``defs``; unchanged when it has no local ``$ref``."""
    if not any(isinstance(n.get("$ref"), str) and n["$ref"].startswith("#")
               for n in subschemas(schema)):
        return schema
    schema = copy.deepcopy(schema)
    for node in subschemas(schema):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            node["$ref"] = f"#/$defs/{name}{ref[1:]}" if ref[1:].startswith("/") or \
                ref == "#" else ref
    defs[name] = schema
    return schema
