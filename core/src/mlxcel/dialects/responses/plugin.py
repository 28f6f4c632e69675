"""Builtin plugin: the OpenAI Responses dialect (/v1/responses and its aliases)."""

from mlxcel.dialects.kit import Dialect, register

mlxcel_register_dialects = register(Dialect(
    name="responses", routes="mlxcel.dialects.responses.routes:build",
    description="OpenAI Responses (create, retrieve, delete, cancel, input_tokens, "
                "compact) and conversations (create, retrieve, delete)",
    errors="mlxcel.dialects.openai.errors:error_body",
    prefixes=("/v1/responses", "/responses", "/v1/conversations", "/conversations")))
