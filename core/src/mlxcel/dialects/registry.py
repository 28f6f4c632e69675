"""Dialect registry."""

from __future__ import annotations

from mlxcel.dialects.api import Dialect
from mlxcel.registry import Registry


class DialectRegistry(Registry[Dialect]):
    def __init__(self) -> None:
        super().__init__("dialect")
