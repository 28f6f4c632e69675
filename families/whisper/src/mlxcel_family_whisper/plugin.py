"""The entry point: register the ``whisper`` family. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
checkpoint check (``detect``, no MLX), the loader and the runner are ``"module:attr"``
strings, imported when a Whisper checkpoint is served.
"""

from mlxcel import hookimpl
from mlxcel.families.api import Family

NAME = "whisper"


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name=NAME,
        model_types=("whisper",),
        tasks={"transcribe": "mlxcel_family_whisper.runner:make"},
        load="mlxcel_family_whisper.load:load",
        check="mlxcel_family_whisper.detect:check",
    ))
