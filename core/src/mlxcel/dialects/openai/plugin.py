"""Builtin plugin: the OpenAI dialect (chat completions, completions, models)."""

from mlxcel.dialects.kit import Dialect, register

mlxcel_register_dialects = register(Dialect(
    name="openai", routes="mlxcel.dialects.openai.routes:build",
    description="OpenAI chat/completions/models",
    errors="mlxcel.dialects.openai.errors:error_body",
    prefixes=("/v1", "/chat", "/models", "/audio", "/images")))
