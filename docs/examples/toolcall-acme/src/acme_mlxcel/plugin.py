"""The entry point: register acme's tool format and family. Heavy code is named, not imported.

mlxcel imports this module at every start-up (and for ``mlxcel-server plugins``), so it
imports only mlxcel's contracts; the parser and the loader are ``"module:attr"`` strings,
imported the first time a request or a checkpoint needs them.
"""

from mlxcel import hookimpl
from mlxcel.families.api import Family
from mlxcel.toolcalls.kit import ToolFormat, register

OPEN = "<acme_call>"


def detect(template: str) -> bool:
    """A chat template that shows the model ``<acme_call>`` speaks acme-xml."""
    return OPEN in template


mlxcel_register_tool_formats = register(ToolFormat(
    name="acme-xml", detect=detect, parser="acme_mlxcel.parser:new_parser", specificity=20))


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name="acme",
        model_types=("acme_lm",),
        tasks={"generate": "acme_mlxcel.loader:decoder"},
        load="acme_mlxcel.loader:load",
        default_tool_format="acme-xml",
    ))
