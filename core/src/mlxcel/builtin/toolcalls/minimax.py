"""MiniMax M2 and MiniMax M3 tool calls: XML invokes inside one section per answer.

M2 (and M2.1/M2.5)::

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    </minimax:tool_call>

M3 writes every tag after the namespace token ``]<]minimax[>[`` and names a parameter by
its tag; a nested object's keys are nested tags and an array's items are ``<item>``
tags (the template's ``to_xml``)::

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="NAME">]<]minimax[>[<KEY>VALUE]<]minimax[>[</KEY>...
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Both templates print a string value as it is and other scalars as JSON, so a leaf value is
typed by the request's schema (``markup_values``): verbatim for a string parameter,
parsed otherwise; M3 follows the schema into nested properties and items. Each invoke is
one call, sent when its ``</invoke>`` arrives. mlx-lm's ``minimax_m2`` decoder is not used:
it turns a string parameter's ``"null"`` into null, strips string values and raises
``OverflowError`` on a number parameter written ``1e999``; it has no M3 decoder.
"""

from __future__ import annotations

from typing import Any

from mlxcel.builtin.toolcalls.markup_values import (
    arguments_json,
    call_name,
    item_schema,
    parameter_schemas,
    property_schema,
    skip_space,
    typed_value,
    types_of,
    unquote,
)
from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

M2_SECTION = (("<minimax:tool_call>",), ("</minimax:tool_call>",))
M2_INVOKE = ("<invoke name=", "</invoke>")
M2_PARAMETER = ("<parameter name=", "</parameter>")

NS = "]<]minimax[>["
M3_SECTION = ((NS + "<tool_call>",), (NS + "</tool_call>",))
M3_INVOKE = (NS + '<invoke name="', NS + "</invoke>")


def decode_m2(body: str, schemas: dict[str, dict]) -> Decoded:
    """``"NAME">`` then ``<parameter name="KEY">VALUE</parameter>`` elements, whitespace
    between them ignored."""
    gt = body.find(">")
    if gt < 0:
        raise MarkupError("the invoke tag is not closed")
    name = call_name(unquote(body[:gt]))
    params = schemas.get(name)
    arguments: dict[str, Any] = {}
    pos = gt + 1
    open_, close = M2_PARAMETER
    while (pos := skip_space(body, pos)) < len(body):
        if not body.startswith(open_, pos):
            raise MarkupError(f"{name}: expected a parameter at {body[pos:pos + 20]!r}")
        gt = body.find(">", pos)
        end = body.find(close, gt + 1) if gt >= 0 else -1
        if end < 0:
            raise MarkupError(f"{name}: a parameter is not closed")
        key = unquote(body[pos + len(open_):gt])
        if not key:
            raise MarkupError(f"{name}: a parameter has no name")
        arguments[key] = typed_value(body[gt + 1:end], property_schema(params, key))
        pos = end + len(close)
    return Decoded(name, arguments_json(arguments))



class _Node:
    """One M3 element: its tag, the text it opens with, its child elements."""

    __slots__ = ("tag", "text", "children")

    def __init__(self, tag: str, text: str) -> None:
        self.tag, self.text, self.children = tag, text, []


def decode_m3(body: str, schemas: dict[str, dict]) -> Decoded:
    """``NAME">`` then namespaced elements; the arguments object is the elements' tree."""
    quote = body.find('">')
    if quote < 0:
        raise MarkupError("the invoke tag is not closed")
    name = call_name(body[:quote])
    root = _tree(body[quote + 2:], name)
    return Decoded(name, arguments_json(_object(root.children, schemas.get(name))))


def _tree(body: str, name: str) -> _Node:
    """The elements of an invoke's body, split at the namespace token; every piece opens
    or closes one element, and only whitespace sits between elements."""
    pieces = body.split(NS)
    if pieces[0].strip():
        raise MarkupError(f"{name}: text outside a parameter: {pieces[0][:20]!r}")
    stack = [_Node("", "")]
    for piece in pieces[1:]:
        gt = piece.find(">")
        if not piece.startswith("<") or gt < 0:
            raise MarkupError(f"{name}: {piece[:20]!r} is not a tag")
        if piece.startswith("</"):
            tag = piece[2:gt].strip()
            if len(stack) == 1 or stack[-1].tag != tag:
                raise MarkupError(f"{name}: </{tag}> closes no open element")
            if piece[gt + 1:].strip():
                raise MarkupError(f"{name}: text after </{tag}>")
            node = stack.pop()
            stack[-1].children.append(node)
        else:
            tag = piece[1:gt].strip()
            if not tag or any(ch.isspace() for ch in tag):
                raise MarkupError(f"{name}: {piece[:gt + 1]!r} is not a parameter tag")
            if stack[-1].text.strip():
                raise MarkupError(f"{name}: <{stack[-1].tag}> holds text and elements")
            stack.append(_Node(tag, piece[gt + 1:]))
    if len(stack) > 1:
        raise MarkupError(f"{name}: <{stack[-1].tag}> is not closed")
    return stack[0]


def _value(node: _Node, schema: Any) -> Any:
    """An element's value: a leaf's text typed by ``schema``; ``<item>`` children make an
    array, other children an object (a repeated tag, an array of its values)."""
    types = types_of(schema) or frozenset()
    if not node.children:
        if not node.text.strip() and types & {"object", "array"} and "string" not in types:
            return {} if "object" in types else []
        return typed_value(node.text, schema)
    items = all(child.tag == "item" for child in node.children)
    if items and not ("object" in types and "array" not in types):
        return [_value(child, item_schema(schema, i)) for i, child in enumerate(node.children)]
    return _object(node.children, schema)


def _object(children: list[_Node], schema: Any) -> dict[str, Any]:
    """Child elements as an object's keys; a tag that repeats holds the list of its
    values."""
    grouped: dict[str, list[Any]] = {}
    for child in children:
        grouped.setdefault(child.tag, []).append(
            _value(child, property_schema(schema, child.tag)))
    return {tag: values[0] if len(values) == 1 else values
            for tag, values in grouped.items()}


def new_parser_m2(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one MiniMax M2 answer; ``tools`` give the parameter types."""
    schemas = parameter_schemas(tools)
    return BlockParser(Blocks(unit=M2_INVOKE, section=M2_SECTION, bare=False,
                              decode=lambda body: decode_m2(body, schemas)))


def new_parser_m3(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one MiniMax M3 answer; ``tools`` give the parameter types."""
    schemas = parameter_schemas(tools)
    return BlockParser(Blocks(unit=M3_INVOKE, section=M3_SECTION, bare=False,
                              decode=lambda body: decode_m3(body, schemas)))
