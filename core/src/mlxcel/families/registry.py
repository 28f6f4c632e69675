"""Family registry: by name, and by the checkpoint ``model_type`` each family claims."""

from __future__ import annotations

from mlxcel.errors import PluginError, StartupError
from mlxcel.families.api import CAPABILITIES, Family
from mlxcel.lazy import resolve
from mlxcel.registry import Registry


class FamilyRegistry(Registry[Family]):
    def __init__(self) -> None:
        super().__init__("model family")
        self._by_type: dict[str, str] = {}

    def add(self, item: Family) -> None:  # type: ignore[override]
        key = item.name
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
        super().add(item)
        for mt in item.model_types:
            self._by_type[mt] = key

    def for_model_type(self, model_type: str, config: dict | None = None) -> Family | None:
        """The family that lists ``model_type``; else the one family whose ``accepts`` takes
        it (with the checkpoint's ``config``). A listed type never reaches ``accepts``, so
        an installed family always takes precedence over a fallback for the types it names;
        two fallbacks taking the same type are a StartupError naming both, since neither
        is more specific than the other."""
        name = self._by_type.get(model_type)
        if name:
            return self.get(name)
        taking = [key for key, family in self.items()
                  if family.accepts and resolve(family.accepts)(model_type, config or {})]
        if len(taking) > 1:
            owners = " and ".join(f"'{k}' (from '{self.owner(k)}')" for k in taking)
            raise StartupError(f"model_type '{model_type}' is accepted by families {owners}; "
                               "disable one of their plugins with --disable-plugins")
        return self.get(taking[0]) if taking else None
