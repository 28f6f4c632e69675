"""The route kit: what a dialect plugin builds on, in core or in a distribution.

A dialect is a ``Dialect`` (``mlxcel.dialects.api``): its routes, its error body and the
path prefixes it owns. The kit holds what every dialect writes the same way:

- ``register(dialect)``: the ``mlxcel_register_dialects`` hook implementation that adds
  it; a plugin module binds it to that name (``mlxcel_register_dialects =
  register(Dialect(...))``), so pluggy finds it like a hand-written hook.
- ``error_typer(table, default)``: an error's wire type from a table of core error
  classes, most specific first, so a dialect's error body names types by one rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxcel.dialects.api import Dialect
from mlxcel.errors import MlxcelError
from mlxcel.plugin_kit import adding

ErrorTable = tuple[tuple[type[MlxcelError], str], ...]

__all__ = ["Dialect", "ErrorTable", "error_typer", "register"]


def register(*dialects: Dialect) -> Callable[[Any], None]:
    """A ``mlxcel_register_dialects`` hook implementation that adds ``dialects``."""
    return adding("mlxcel_register_dialects", *dialects)


def error_typer(table: ErrorTable, default: str) -> Callable[[MlxcelError], str]:
    """``error_type(exc)``: the name of the first class in ``table`` that ``exc`` is an
    instance of (so a subclass listed first wins), else ``default``."""

    def error_type(exc: MlxcelError) -> str:
        return next((name for cls, name in table if isinstance(exc, cls)), default)

    return error_type
