"""Resolve "module:attr" strings, so plugins can name heavy code without importing it."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(target: str | Any) -> Any:
    """Import ``"package.module:attr"`` (dotted attrs allowed); pass objects through."""
    if not isinstance(target, str):
        return target
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj
