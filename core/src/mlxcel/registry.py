"""A typed registry that refuses duplicate names and remembers who registered what."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from mlxcel.errors import PluginError

T = TypeVar("T")


class Registry(Generic[T]):
    """Items of one extension point keyed by their own ``name`` (``add(item)``), so a key
    can never differ from the name the item reports; each name has exactly one owner."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}
        self.current_owner = "<unknown>"

    def add(self, item: T) -> None:
        key = getattr(item, "name", None)
        if not key or not isinstance(key, str):
            raise PluginError(f"{self.current_owner}: a {self.kind} needs a non-empty name")
        if key in self._items:
            raise PluginError(
                f"duplicate {self.kind} '{key}': registered by '{self._owners[key]}' "
                f"and again by '{self.current_owner}'"
            )
        self._items[key] = item
        self._owners[key] = self.current_owner

    def check_kind_and_ref(self, item: T, kinds: Iterable[str], ref: str) -> str:
        """Refuse an item whose ``kind`` is none of ``kinds``, or whose field ``ref`` is not
        a ``"module:attr"`` string: core imports it only on first use, so a bad one would
        otherwise surface mid-request rather than at start-up. Returns the prefix that
        names the item in a further error (``"owner: drafter 'x'"``)."""
        where = f"{self.current_owner}: {self.kind} '{getattr(item, 'name', None)}'"
        kind = getattr(item, "kind", None)
        if kind not in kinds:
            raise PluginError(f"{where} has unknown kind {kind!r} "
                              f"(known: {', '.join(kinds)})")
        value = getattr(item, ref, None)
        if not isinstance(value, str) or ":" not in value:
            raise PluginError(f"{where}: {ref} must be a 'module:attr' string")
        return where

    def get(self, key: str) -> T:
        try:
            return self._items[key]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise KeyError(f"no {self.kind} named '{key}' (known: {known})") from None

    def owner(self, key: str) -> str:
        return self._owners[key]

    def keys_of(self, owner: str) -> list[str]:
        return [k for k, o in self._owners.items() if o == owner]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())
