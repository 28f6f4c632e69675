"""What the public kits share for writing a plugin module: a registration hook from data.

A plugin that only adds fixed items (tool formats, dialects, families) binds the hook to
its name, ``mlxcel_register_<kind> = adding("mlxcel_register_<kind>", item, ...)``, instead
of writing the same three-line hook function again; pluggy finds the module attribute like
a hand-written one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxcel import hookimpl


def adding(hook: str, *items: Any) -> Callable[[Any], None]:
    """The ``hook`` implementation that adds each of ``items`` to the registry it is given."""

    def add(registry: Any) -> None:
        for item in items:
            registry.add(item)

    add.__name__ = add.__qualname__ = hook
    return hookimpl(add)
