"""The builtin tool formats whose call bodies are markup, not a JSON call object.

Each is detected in a chat template by the markers the template writes, and its parser
is a ``"module:attr"`` string, imported when a request first needs it: this module is
imported at every start-up, so it imports only mlxcel's contract. Specificity follows the
rule of ``mlxcel.toolcalls.api``: 20 for a marker of the family's own, 30 for GLM's
``<arg_key>``, which only appears inside Hermes' generic ``<tool_call>`` (10).

These formats send each call whole when its markup closes, and their forced tool choice
gets the directive without a grammar (``grammar`` None).
"""

from __future__ import annotations

from mlxcel.toolcalls.api import ToolFormat

_PACKAGE = "mlxcel.builtin.toolcalls"
MINIMAX_NS = "]<]minimax[>["


def detect_minimax_m2(template: str) -> bool:
    """MiniMax M2's template sets ``<minimax:tool_call>`` as its call wrapper."""
    return "<minimax:tool_call>" in template and MINIMAX_NS not in template


def detect_minimax_m3(template: str) -> bool:
    """MiniMax M3's template prefixes every tag with its namespace token, and builds its
    wrapper from it (``ns_token ~ '<tool_call>'``)."""
    return MINIMAX_NS in template and "<invoke name=" in template


def detect_kimi_k2(template: str) -> bool:
    """Kimi K2's template writes calls inside ``<|tool_calls_section_begin|>``."""
    return "<|tool_calls_section_begin|>" in template


def detect_glm47(template: str) -> bool:
    """GLM-4.5/4.6/4.7 templates write ``<arg_key>`` pairs inside ``<tool_call>``."""
    return "<tool_call>" in template and "<arg_key>" in template


def detect_longcat(template: str) -> bool:
    """LongCat-Flash's template writes ``<longcat_tool_call>``."""
    return "<longcat_tool_call>" in template


def detect_harmony(template: str) -> bool:
    """gpt-oss' template writes channels and addresses calls to ``functions.NAME``
    (``"<|start|>assistant to=" + "functions." + name``: the two are written apart)."""
    return "<|channel|>" in template and "to=" in template and "functions." in template


def detect_function_gemma(template: str) -> bool:
    """FunctionGemma's template writes ``<start_function_call>``."""
    return "<start_function_call>" in template


FORMATS: tuple[ToolFormat, ...] = tuple(
    ToolFormat(name=name, detect=detect, specificity=specificity,
               parser=f"{_PACKAGE}.{parser}")
    for name, detect, specificity, parser in (
        ("minimax_m2", detect_minimax_m2, 20, "minimax:new_parser_m2"),
        ("minimax_m3", detect_minimax_m3, 20, "minimax:new_parser_m3"),
        ("kimi_k2", detect_kimi_k2, 20, "kimi_k2:new_parser"),
        ("glm47", detect_glm47, 30, "glm47:new_parser"),
        ("longcat", detect_longcat, 20, "longcat:new_parser"),
        ("harmony", detect_harmony, 20, "harmony:new_parser"),
        ("function_gemma", detect_function_gemma, 20, "function_gemma:new_parser"),
    )
)
