"""Kimi K2: ``<|tool_calls_section_begin|>`` then, per call, ``<|tool_call_begin|>
functions.NAME:INDEX<|tool_call_argument_begin|>{json}<|tool_call_end|>``, then
``<|tool_calls_section_end|>``.

``functions.NAME:INDEX`` is the call's id (the template writes a call back by its id, so
the next turn needs the same one): it is ``CallStart.id``. The arguments are the model's
JSON text verbatim, as the spec asks of JSON bodies. The singular
``<|tool_call_section_begin|>`` some checkpoints write is a section too, and a call
outside any section still counts (the markers are special tokens, never prose). mlx-lm's
``kimi_k2`` decoder is not used: it decodes the arguments (``json.loads``, else
``ast.literal_eval``), so their text is not kept, needs the ``:INDEX`` suffix and sees
neither the singular section marker nor a call outside a section.
"""

from __future__ import annotations

from typing import Any

from mlxcel.builtin.toolcalls.markup_values import call_name, json_object_text
from mlxcel.toolcalls.kit import BlockParser, Blocks, Decoded, MarkupError

SECTION = (("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"),
           ("<|tool_calls_section_end|>", "<|tool_call_section_end|>"))
CALL = ("<|tool_call_begin|>", "<|tool_call_end|>")
ARGUMENTS = "<|tool_call_argument_begin|>"


def decode(body: str) -> Decoded:
    """``[functions.]NAME[:INDEX]<|tool_call_argument_begin|>{json}``: the name without
    its namespace and index, the id as written."""
    head, marker, arguments = body.partition(ARGUMENTS)
    if not marker:
        raise MarkupError(f"the call has no {ARGUMENTS}")
    call_id = head.strip()
    name = call_id.removeprefix("functions.")
    stem, colon, index = name.rpartition(":")
    if colon and index.isdigit():
        name = stem
    return Decoded(call_name(name), json_object_text(arguments), call_id)


def new_parser(tools: tuple[Any, ...]) -> BlockParser:
    """A parser for one Kimi K2 answer (the JSON arguments need no schema)."""
    return BlockParser(Blocks(unit=CALL, decode=decode, section=SECTION))
