"""Builtin plugin: the Anthropic Messages dialect (/v1/messages, /v1/messages/count_tokens)."""

from mlxcel.dialects.kit import Dialect, register

mlxcel_register_dialects = register(Dialect(
    name="anthropic", routes="mlxcel.dialects.anthropic.routes:build",
    description="Anthropic Messages",
    errors="mlxcel.dialects.anthropic.errors:error_body",
    prefixes=("/v1/messages", "/messages")))
