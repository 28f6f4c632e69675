"""LongCat-Flash: ``<longcat_tool_call>NAME<longcat_arg_key>K</longcat_arg_key>
<longcat_arg_value>V</longcat_arg_value>...</longcat_tool_call>``, one block per call.

GLM's shape with prefixed tags (``glm47.decode_pairs``), values typed by the request's
schema; a body that is a JSON object ``{"name": ..., "arguments": {...}}`` (what earlier
LongCat-Flash-Chat checkpoints write in the same block) is taken too. mlx-lm's ``longcat``
decoder is not used: it raises ``AttributeError`` on a call without arguments, strips
string values and types only ``"type": "string"``.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcel.builtin.toolcalls.glm47 import decode_pairs
from mlxcel.builtin.toolcalls.markup_values import (
    arguments_json,
    call_name,
    parameter_schemas,
)
from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

OPEN, CLOSE = "<longcat_tool_call>", "</longcat_tool_call>"
TAGS = ("<longcat_arg_key>", "</longcat_arg_key>", "<longcat_arg_value>",
        "</longcat_arg_value>")


def decode(body: str, schemas: dict[str, dict]) -> Decoded:
    """One call's body: a JSON object with ``name`` and ``arguments``, else key/value
    tags."""
    if body.lstrip().startswith("{"):
        return _decode_json(body)
    return decode_pairs(body, schemas, TAGS)


def _decode_json(body: str) -> Decoded:
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):
        raise MarkupError("the call is not valid JSON") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise MarkupError("the JSON call has no name")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise MarkupError("the call's arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise MarkupError("the call's arguments are not a JSON object")
    return Decoded(call_name(call["name"]), arguments_json(arguments))


def new_parser(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one LongCat-Flash answer; ``tools`` give the parameter types."""
    schemas = parameter_schemas(tools)
    return BlockParser(Blocks(unit=(OPEN, CLOSE), decode=lambda body: decode(body, schemas)))
