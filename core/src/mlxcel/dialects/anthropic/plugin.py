"""Builtin plugin: the Anthropic Messages dialect (/v1/messages, /v1/messages/count_tokens)."""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.dialects.api import Dialect


@hookimpl
def mlxcel_register_dialects(registry) -> None:
    registry.add(Dialect(
        name="anthropic", routes="mlxcel.dialects.anthropic.routes:build",
        description="Anthropic Messages",
        errors="mlxcel.dialects.anthropic.errors:error_body",
        prefixes=("/v1/messages", "/messages")))
