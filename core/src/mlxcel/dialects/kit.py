"""The route kit: what a dialect plugin builds on, in core or in a distribution.

A dialect is a ``Dialect`` (``mlxcel.dialects.api``): its routes, its error body and the
path prefixes it owns. The kit holds what every dialect writes the same way:

- ``register(dialect)``: the ``mlxcel_register_dialects`` hook implementation that adds
  it; a plugin module binds it to that name (``mlxcel_register_dialects =
  register(Dialect(...))``), so pluggy finds it like a hand-written hook.
- ``GenerationFields``: the request fields the OpenAI-style and llama-server bodies share
  under the same names (sampling, loop detection, reasoning budgets, structured output);
  a dialect's request struct extends it, so the chat path reads them one way.
- ``error_typer(table, default)``: an error's wire type from a table of core error
  classes, most specific first, so a dialect's error body names types by one rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from mlxcel.dialects.api import Dialect
from mlxcel.errors import MlxcelError
from mlxcel.plugin_kit import adding

ErrorTable = tuple[tuple[type[MlxcelError], str], ...]

__all__ = ["Dialect", "ErrorTable", "GenerationFields", "error_typer", "register"]


class GenerationFields(msgspec.Struct, kw_only=True):
    """Generation fields that more than one wire shape spells the same (None: absent)."""

    # length and stopping
    stream: bool = False
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    # sampling
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    # penalties on what the answer already holds
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    # DRY: penalise extending a sequence that repeats
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    # candidates left out: P-less decoding, XTC (exclude top choices)
    p_less: bool | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    # loop detection
    max_pattern_size: int | None = None
    min_pattern_size: int | None = None
    min_count: int | None = None
    # the prompt cache, reasoning budgets (chat.request.REASONING_BUDGET_ALIASES), and
    # structured output (chat.structured)
    cache_prompt: bool | None = None
    thinking_budget_tokens: int | None = None
    reasoning_budget_tokens: int | None = None
    thinking_budget: int | None = None
    response_format: dict[str, Any] | None = None
    # llama-server's per-request draft length cap and floor (``dialects.draft_fields``)
    speculative_n_max: Any = msgspec.field(default=None, name="speculative.n_max")
    speculative_n_min: Any = msgspec.field(default=None, name="speculative.n_min")


def register(*dialects: Dialect) -> Callable[[Any], None]:
    """A ``mlxcel_register_dialects`` hook implementation that adds ``dialects``."""
    return adding("mlxcel_register_dialects", *dialects)


def error_typer(table: ErrorTable, default: str) -> Callable[[MlxcelError], str]:
    """``error_type(exc)``: the name of the first class in ``table`` that ``exc`` is an
    instance of (so a subclass listed first wins), else ``default``."""

    def error_type(exc: MlxcelError) -> str:
        return next((name for cls, name in table if isinstance(exc, cls)), default)

    return error_type
