"""The OpenAI error body: ``{"error": {"message", "type", "code", ...}}``, the ``type`` a
core error class's wire name. llama-server answers in the same shape, so its dialect uses
this one too."""

from __future__ import annotations

from typing import Any

from mlxcel import errors as e
from mlxcel.dialects.kit import ErrorTable, error_typer

# most specific first: the first class an error is an instance of names its type
TYPES: ErrorTable = (
    (e.MemoryBudgetExceeded, "request_memory_budget_exceeded"),
    (e.Overloaded, "server_busy"),
    (e.RequestTimedOut, "timeout_error"),
    (e.MissingApiKey, "missing_api_key"),
    (e.Unauthorized, "invalid_api_key"),
    (e.NotFound, "not_found_error"),
    (e.CapabilityNotSupported, "not_supported_error"),
    (e.NoModelForRoute, "not_implemented"),
    (e.Forbidden, "invalid_request_error"),
    (e.InvalidRequest, "invalid_request_error"),
)


error_type = error_typer(TYPES, "server_error")


def error_body(exc: e.MlxcelError) -> dict[str, Any]:
    """The body of an error response (and, under ``error``, of an SSE error frame)."""
    extra = {"param": exc.param} if exc.param else {}
    return {"error": {"message": exc.message, "type": error_type(exc), "code": exc.code,
                      **extra, **exc.extra}}
