"""GLM-4.7 (and GLM-4.5/4.6): ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
...</tool_call>``, one block per call.

The template writes ``'<tool_call>' + name``, then for each argument the key and the value
(a string as it is, anything else ``tojson``), with no whitespace in 4.7 and a newline
around each tag in 4.5/4.6; both decode here. Values are typed by the request's schema
(``markup_values``). mlx-lm's ``glm47`` decoder is not used: it strips string values,
types only ``"type": "string"`` (a nullable string's ``"7"`` becomes 7) and can return a
Python set or tuple from ``ast.literal_eval``.
"""

from __future__ import annotations

from typing import Any

from mlxcel.builtin.toolcalls.markup_values import (
    arguments_json,
    call_name,
    parameter_schemas,
    property_schema,
    skip_space,
    typed_value,
)
from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TAGS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def decode_pairs(body: str, schemas: dict[str, dict],
                 tags: tuple[str, str, str, str] = TAGS) -> Decoded:
    """``NAME`` then key/value tag pairs (whitespace between tags ignored); values typed
    by ``schemas[NAME]``. Anything else in the body is a ``MarkupError``."""
    key_open, key_close, value_open, value_close = tags
    at = body.find(key_open)
    name = call_name(body if at < 0 else body[:at])
    params = schemas.get(name)
    arguments: dict[str, Any] = {}
    pos = len(body) if at < 0 else at
    while True:
        pos = skip_space(body, pos)
        if pos == len(body):
            return Decoded(name, arguments_json(arguments))
        key, pos = _tagged(body, pos, key_open, key_close, "an argument key")
        key = key.strip()
        if not key:
            raise MarkupError(f"{name}: an argument key is empty")
        value, pos = _tagged(body, skip_space(body, pos), value_open, value_close,
                             f"the value of {key!r}")
        arguments[key] = typed_value(value, property_schema(params, key))



def _tagged(body: str, pos: int, open_: str, close: str, what: str) -> tuple[str, int]:
    """The text between ``open_`` at ``pos`` and the next ``close``, and where it ends."""
    if not body.startswith(open_, pos):
        raise MarkupError(f"expected {what} ({open_}) at {body[pos:pos + 20]!r}")
    end = body.find(close, pos + len(open_))
    if end < 0:
        raise MarkupError(f"{what} is not closed ({close})")
    return body[pos + len(open_):end], end + len(close)


def new_parser(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one GLM answer; ``tools`` give the parameter types."""
    schemas = parameter_schemas(tools)
    return BlockParser(Blocks(unit=(OPEN, CLOSE),
                              decode=lambda body: decode_pairs(body, schemas)))
