"""Drafter registry: drafters by name."""

from __future__ import annotations

from mlxcel.drafters.api import DRAFT_KINDS, Drafter
from mlxcel.errors import PluginError
from mlxcel.registry import Registry


class DrafterRegistry(Registry[Drafter]):
    def __init__(self) -> None:
        super().__init__("drafter")

    def add(self, item: Drafter) -> None:  # type: ignore[override]
        """Refuse an unknown kind and a session that is not a ``"module:attr"`` string."""
        where = f"{self.current_owner}: drafter '{item.name}'"
        if item.kind not in DRAFT_KINDS:
            raise PluginError(f"{where} has unknown kind {item.kind!r} "
                              f"(known: {', '.join(DRAFT_KINDS)})")
        if not isinstance(item.session, str) or ":" not in item.session:
            raise PluginError(f"{where}: session must be a 'module:attr' string")
        super().add(item)
