"""The entry point: register the {{tool_format}} tool format. Heavy code is named, not imported.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
parser is a ``"module:attr"`` string, imported the first time a request needs it.
"""

from mlxcel.toolcalls.kit import ToolFormat, register

OPEN = "<{{tool_format}}>"


def detect(template: str) -> bool:
    """A chat template that shows the model the opening tag uses this format."""
    return OPEN in template


mlxcel_register_tool_formats = register(ToolFormat(
    name="{{tool_format}}", detect=detect, parser="{{package}}.parser:new_parser",
    specificity=20))  # a marker of its own (see the hooks reference for the scale)
