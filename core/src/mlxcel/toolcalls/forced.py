"""Forced tool calls: the JSON schema of "a call of one of these tools", from which a tool
format whose wire form wraps a JSON object in fixed markup builds its ``grammar``.

``tool_choice`` ``required`` (any declared tool) and a named function (the one tool left
after ``tool_choice``) reduce to the same thing here, since the chat layer has already
narrowed the tools to those the model may call.
"""

from __future__ import annotations

from typing import Any

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
    calls = [{"type": "object",
              "properties": {"name": {"const": t.name}, arguments: parameters(t)},
              "required": ["name", arguments], "additionalProperties": False}
             for t in tools]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}
