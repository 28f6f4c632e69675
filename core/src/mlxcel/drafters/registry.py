"""Drafter registry: drafters by name."""

from __future__ import annotations

from mlxcel.drafters.api import DRAFT_KINDS, Drafter
from mlxcel.registry import Registry


class DrafterRegistry(Registry[Drafter]):
    def __init__(self) -> None:
        super().__init__("drafter")

    def add(self, item: Drafter) -> None:  # type: ignore[override]
        """Refuse an unknown kind and a session that is not a ``"module:attr"`` string."""
        self.check_kind_and_ref(item, DRAFT_KINDS, "session")
        super().add(item)
