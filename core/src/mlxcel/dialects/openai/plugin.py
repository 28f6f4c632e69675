"""Builtin plugin: the OpenAI dialect (chat completions, completions, models)."""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.dialects.api import Dialect


@hookimpl
def mlxcel_register_dialects(registry) -> None:
    registry.add(Dialect(
        name="openai", routes="mlxcel.dialects.openai.routes:build",
        description="OpenAI chat/completions/models",
        errors="mlxcel.dialects.openai.errors:error_body",
        prefixes=("/v1", "/chat", "/models", "/audio", "/images")))
