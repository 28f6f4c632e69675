"""The {{tool_format}} parser: ``<{{tool_format}}>{"name": ..., "arguments": {...}}</{{tool_format}}>``.

A starting point built on the tool-format kit (``mlxcel.toolcalls.kit``): ``BlockParser``
streams answer text as soon as it cannot start a tag, holds a partial tag until the next
text settles it, and sends each call whole once its closing tag arrives (or the answer
ends inside it); this module only decodes a call's body. To stream a call's arguments
while they are generated, build on ``TextStates`` as ``docs/tutorial/first-tool-format.md``
shows.
"""

from __future__ import annotations

import json

from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

OPEN, CLOSE = "<{{tool_format}}>", "</{{tool_format}}>"


def decode(body: str) -> Decoded:
    """``{"name": ..., "arguments": {...}}`` as a call; ``MarkupError`` where it is not
    one (the kit then sends the markup back whole as a ``CallError``)."""
    try:
        call = json.loads(body)
        name, arguments = call["name"], call["arguments"]
    except (ValueError, TypeError, KeyError) as exc:
        raise MarkupError("not a JSON call") from exc
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise MarkupError("not a JSON call")
    return Decoded(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


BLOCKS = Blocks(unit=(OPEN, CLOSE), decode=decode)


def new_parser(tools: tuple) -> BlockParser:
    """What ``ToolFormat.parser`` names: a fresh parser for one answer, given the request's
    function tools (``mlxcel.types.messages.Tool``)."""
    return BlockParser(BLOCKS)
