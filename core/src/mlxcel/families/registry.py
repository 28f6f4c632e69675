"""Family registry: by name, and by the checkpoint ``model_type`` each family claims."""

from __future__ import annotations

from mlxcel.errors import PluginError
from mlxcel.families.api import CAPABILITIES, Family
from mlxcel.registry import Registry


class FamilyRegistry(Registry[Family]):
    def __init__(self) -> None:
        super().__init__("model family")
        self._by_type: dict[str, str] = {}

    def register(self, key: str, item: Family) -> None:  # type: ignore[override]
        unknown = set(item.capabilities) - CAPABILITIES
        if unknown:
            raise PluginError(f"{self.current_owner}: unknown capabilities {sorted(unknown)}")
        for mt in item.model_types:
            if mt in self._by_type:
                other = self._by_type[mt]
                raise PluginError(
                    f"duplicate model_type '{mt}': claimed by family '{other}' "
                    f"(from '{self.owner(other)}') and by '{key}' (from '{self.current_owner}')"
                )
        super().register(key, item)
        for mt in item.model_types:
            self._by_type[mt] = key

    def for_model_type(self, model_type: str) -> Family | None:
        name = self._by_type.get(model_type)
        return self.get(name) if name else None
