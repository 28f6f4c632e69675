"""The entry point: register the ``vlm`` family. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
checkpoint check (``detect``, no MLX), the loader and the decoder are ``"module:attr"``
strings, imported when a vision-language checkpoint is served.
"""

from mlxcel.families.api import Family
from mlxcel.plugin_kit import adding

from mlxcel_family_vlm.detect import MODEL_TYPES

NAME = "vlm"


mlxcel_register_families = adding("mlxcel_register_families", Family(
    name=NAME, model_types=MODEL_TYPES, tasks={"generate": "mlxcel_family_vlm.load:decoder"},
    load="mlxcel_family_vlm.load:load", check="mlxcel_family_vlm.detect:check"))
