"""Builtin plugin: core's drafters (prompt lookup, draft models), registered through the
same entry point (``drafter-builtin``) as a third party's, so ``--plugins`` and
``--disable-plugins`` treat them alike."""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.drafters.api import Drafter


@hookimpl
def mlxcel_register_drafters(registry) -> None:
    registry.add(Drafter(name="prompt-lookup", kind="prompt-lookup",
                         session="mlxcel.drafters.lookup:new_session"))
    registry.add(Drafter(name="draft-model", kind="draft",
                         session="mlxcel.drafters.model:new_session", needs_model=True))
