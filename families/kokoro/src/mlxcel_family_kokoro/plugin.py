"""The entry point: register the ``kokoro`` family. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
checkpoint check (``detect``, no MLX), the loader and the ``speak`` runner are
``"module:attr"`` strings, imported when a Kokoro checkpoint is served.

The family lists no ``model_type``: Kokoro-82M's own ``config.json`` names none, and its
MLX conversions may add ``"kokoro"`` or not. A family that lists types is only asked about
checkpoints of those types, so this one is a catch-all whose ``check`` recognises Kokoro's
config by its own fields (``istftnet``, ``plbert``, ``vocab``) and declines everything
else; a family that names ``kokoro`` would still take precedence over it.
"""

from mlxcel import hookimpl
from mlxcel.families.api import Family

NAME = "kokoro"


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name=NAME,
        tasks={"speak": "mlxcel_family_kokoro.speaker:make"},
        load="mlxcel_family_kokoro.load:load",
        check="mlxcel_family_kokoro.detect:check",
    ))
