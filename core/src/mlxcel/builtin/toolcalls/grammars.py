"""Forced-call grammars of the builtin formats whose wire form is a JSON object in fixed
markup: what ``tool_choice`` ``required`` or a named function constrains the answer to.
The markup's markers are written as the tokenizer's own token where it has one (the
constraint's ``markers``), as the model was trained to write them."""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.forced import call_schema
from mlxcel.types.constraints import WrappedJsonConstraint

HERMES = ("<tool_call>", "</tool_call>")
TOOL_CALLS = "[TOOL_CALLS]"


def hermes(tools: tuple[Any, ...], choice: Any) -> WrappedJsonConstraint:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""
    return WrappedJsonConstraint.around("<tool_call>\n", call_schema(tools), "\n</tool_call>",
                                        markers=HERMES)


def mistral_nemo(tools: tuple[Any, ...], choice: Any) -> WrappedJsonConstraint:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""
    return WrappedJsonConstraint.around(
        TOOL_CALLS, {"type": "array", "items": call_schema(tools), "minItems": 1},
        markers=(TOOL_CALLS,))


def llama3(tools: tuple[Any, ...], choice: Any) -> WrappedJsonConstraint:
    """``{"name": ..., "parameters": {...}}``, the whole answer."""
    return WrappedJsonConstraint.around("", call_schema(tools, "parameters"))


def firefunction_v2(tools: tuple[Any, ...], choice: Any) -> WrappedJsonConstraint:
    """`` functools[{"name": ..., "arguments": {...}}, ...]``."""
    return WrappedJsonConstraint.around(
        " functools", {"type": "array", "items": call_schema(tools), "minItems": 1})
