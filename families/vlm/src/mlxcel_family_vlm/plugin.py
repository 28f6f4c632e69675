"""The entry point: register the ``vlm`` family. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
checkpoint check (``detect``, no MLX), the loader and the decoder are ``"module:attr"``
strings, imported when a vision-language checkpoint is served.
"""

from mlxcel import hookimpl
from mlxcel.families.api import Family

from mlxcel_family_vlm.detect import MODEL_TYPES

NAME = "vlm"


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name=NAME,
        model_types=MODEL_TYPES,
        tasks={"generate": "mlxcel_family_vlm.load:decoder"},
        load="mlxcel_family_vlm.load:load",
        check="mlxcel_family_vlm.detect:check",
    ))
