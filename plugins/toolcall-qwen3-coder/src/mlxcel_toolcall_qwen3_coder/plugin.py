"""The entry point: register the ``qwen3_coder`` tool format. Parser and grammar are named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
parser and the forced-call grammar are ``"module:attr"`` strings, imported on first use.
"""

from mlxcel.toolcalls.kit import ToolFormat, register

NAME = "qwen3_coder"
MARKERS = ("<tool_call>", "<function=", "<parameter=")
# Above Hermes' <tool_call> JSON (10): a Qwen3-Coder template writes <tool_call> as well.
SPECIFICITY = 30


def detect(template: str) -> bool:
    """A template that writes ``<function=`` and ``<parameter=`` inside ``<tool_call>``
    teaches the model this format; all three must appear, since each alone is common."""
    return all(marker in template for marker in MARKERS)


mlxcel_register_tool_formats = register(ToolFormat(
    name=NAME, detect=detect, parser="mlxcel_toolcall_qwen3_coder.parser:new_parser",
    specificity=SPECIFICITY, grammar="mlxcel_toolcall_qwen3_coder.grammar:grammar"))
