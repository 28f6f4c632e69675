"""The builtin tool formats whose call bodies are JSON (and pythonic, its literal cousin).

Each is detected in a chat template by what the template writes, and its parser is a
``"module:attr"`` string, imported when a request first needs it: this module is imported
at every start-up, so it imports only mlxcel's contract. Specificity follows
``mlxcel.toolcalls.api``: 10 for a marker other formats' templates contain too (Hermes'
``<tool_call>``, which Qwen3-Coder's and GLM's templates also write; generic JSON's
``"arguments"``), 20 for a marker of the family's own (DeepSeek's full-width
``<｜tool▁calls▁begin｜>``, FireFunction's ``functools[``, whose template also writes
generic JSON's ``"arguments"``), 30 for one that only appears next
to a more generic marker (Granite's ``<|start_of_role|>`` turns beside ``<tool_call>``;
Functionary and the pythonic Llama templates beside Llama 3's ipython header).

Hermes, both Mistral forms, Llama 3, generic JSON, Functionary, Command R, Granite,
DeepSeek V3.1 and R1 and FireFunction v2 stream each call's name and arguments as they are
generated; pythonic calls are sent whole when their list closes. A forced tool choice
(``required``, or a named function) is constrained for the JSON-in-fixed-markup forms
(Hermes, Mistral Nemo, Llama 3, FireFunction v2: ``grammars``); the others get the
prompt's directive only.
"""

from __future__ import annotations

from mlxcel.toolcalls.api import ToolFormat

_PACKAGE = "mlxcel.builtin.toolcalls"
LLAMA_IPYTHON = "<|start_header_id|>ipython<|end_header_id|>"


def detect_hermes(template: str) -> bool:
    """Hermes, Qwen2.5/3 and DeepSeek distills wrap each call in ``<tool_call>``."""
    return "<tool_call>" in template


def detect_mistral_nemo(template: str) -> bool:
    """Mistral Nemo and Small 3.1 write ``[TOOL_CALLS]`` then a JSON list: no ``[ARGS]``."""
    return "[TOOL_CALLS]" in template and "[ARGS]" not in template


def detect_mistral_bracketed(template: str) -> bool:
    """v11+ Mistral templates write ``[TOOL_CALLS]NAME[ARGS]{json}``."""
    return "[TOOL_CALLS]" in template and "[ARGS]" in template


def detect_llama3(template: str) -> bool:
    """Llama 3.1-3.3 templates return tool results in an ``ipython`` turn."""
    return LLAMA_IPYTHON in template


def detect_generic_json(template: str) -> bool:
    """A template that asks for bare ``{"name", "arguments"}`` JSON; one that wraps it in
    ``<tool_call>`` is Hermes' (both are 10, so the generic one steps aside)."""
    asks = '"arguments"' in template or '\\"arguments\\"' in template
    return asks and "<tool_call>" not in template


def detect_functionary_v3_1(template: str) -> bool:
    """Functionary v3.1 writes ``<function=NAME>`` in a Llama 3.1 template."""
    return "<function=" in template and "<|start_header_id|>" in template


def detect_functionary_v3_2(template: str) -> bool:
    """Functionary v3.2 addresses its text to ``>>>all``."""
    return ">>>all" in template


def detect_command_r(template: str) -> bool:
    """Command R7B writes ``<|START_ACTION|>``; Command R/R+'s tool-use template writes
    ``Action:`` in its chatbot turns."""
    return "<|START_ACTION|>" in template or \
        ("Action:" in template and "<|CHATBOT_TOKEN|>" in template)


def detect_granite(template: str) -> bool:
    """Granite templates write ``<|start_of_role|>`` turns and ask for ``<|tool_call|>``
    (3.x) or ``<tool_call>`` (4.0, which the Granite parser reads as well)."""
    return "<|start_of_role|>" in template and \
        ("<|tool_call|>" in template or "<tool_call>" in template)


def detect_pythonic(template: str) -> bool:
    """LFM2-style ``<|tool_call_start|>`` markers, or a Llama pythonic template's
    ``[func_name1(`` example."""
    return any(m in template for m in ("<|tool_call_start|>", "<|tool_list_start|>",
                                       "[func_name1("))


def detect_deepseek_v3_1(template: str) -> bool:
    """DeepSeek V3.1 writes ``NAME<｜tool▁sep｜>{json}`` in a ``<｜tool▁calls▁begin｜>``
    section: no ```` ```json ```` fence (R1's)."""
    return "<｜tool▁calls▁begin｜>" in template and "<｜tool▁sep｜>" in template \
        and "```json" not in template


def detect_deepseek_r1(template: str) -> bool:
    """DeepSeek R1, its distills and V3 write ``function<｜tool▁sep｜>NAME`` then the
    arguments in a ```` ```json ```` fence, in a ``<｜tool▁calls▁begin｜>`` section."""
    return "<｜tool▁calls▁begin｜>" in template and "<｜tool▁sep｜>" in template \
        and "```json" in template


def detect_firefunction_v2(template: str) -> bool:
    """FireFunction v2's template writes the calls as `` functools[...]``."""
    return "functools[" in template


def _format(name: str, detect, specificity: int, module: str,
            grammar: str | None = None, parser: str = "new_parser") -> ToolFormat:
    return ToolFormat(name=name, detect=detect, specificity=specificity,
                      parser=f"{_PACKAGE}.{module}:{parser}",
                      grammar=f"{_PACKAGE}.grammars:{grammar}" if grammar else None)


FORMATS: tuple[ToolFormat, ...] = (
    _format("hermes", detect_hermes, 10, "hermes", "hermes"),
    _format("mistral_nemo", detect_mistral_nemo, 20, "mistral", "mistral_nemo"),
    _format("mistral_bracketed", detect_mistral_bracketed, 20, "mistral"),
    _format("llama3", detect_llama3, 20, "llama3", "llama3"),
    _format("generic_json", detect_generic_json, 10, "generic_json"),
    _format("functionary_v3_1", detect_functionary_v3_1, 30, "functionary_v31"),
    _format("functionary_v3_2", detect_functionary_v3_2, 30, "functionary_v32"),
    _format("command_r", detect_command_r, 20, "command_r"),
    _format("granite", detect_granite, 30, "granite"),
    _format("pythonic", detect_pythonic, 30, "pythonic"),
    _format("deepseek_v3_1", detect_deepseek_v3_1, 20, "deepseek", parser="new_parser_v3_1"),
    _format("deepseek_r1", detect_deepseek_r1, 20, "deepseek", parser="new_parser_r1"),
    _format("firefunction_v2", detect_firefunction_v2, 20, "firefunction", "firefunction_v2"),
)
