"""Builtin plugin: llama-server's native routes (completion, infill, apply-template,
tokenize, detokenize, health, props, slots)."""

from mlxcel.dialects.kit import Dialect, register

mlxcel_register_dialects = register(Dialect(
    name="llamacpp", routes="mlxcel.dialects.llamacpp.routes:build",
    description="llama-server native routes",
    errors="mlxcel.dialects.llamacpp.errors:error_body",  # llama-server's own shape
    prefixes=("/completion", "/infill", "/apply-template", "/tokenize", "/detokenize",
              "/props", "/slots", "/health", "/live", "/v1/cache", "/embedding", "/rerank")))
