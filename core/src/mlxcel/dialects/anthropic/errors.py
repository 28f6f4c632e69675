"""The Anthropic error body: ``{"type": "error", "error": {"type", "message"}}``, the inner
``type`` one of Anthropic's error types (the SDK reads the status; clients show the type
and message). Statuses stay the core error's: 503 for a full queue, as on every route of
this server (Anthropic's own API uses 529), and 501 for what the loaded model cannot do."""

from __future__ import annotations

from typing import Any

from mlxcel import errors as e
from mlxcel.dialects.kit import ErrorTable, error_typer

# most specific first: the first class an error is an instance of names its type
TYPES: ErrorTable = (
    (e.MemoryBudgetExceeded, "overloaded_error"),
    (e.Overloaded, "overloaded_error"),
    (e.RequestTimedOut, "timeout_error"),
    (e.Unauthorized, "authentication_error"),
    (e.Forbidden, "permission_error"),
    (e.NotFound, "not_found_error"),
    (e.PayloadTooLarge, "request_too_large"),
    (e.CapabilityNotSupported, "not_supported_error"),
    (e.InvalidRequest, "invalid_request_error"),
)


error_type = error_typer(TYPES, "api_error")


def error_body(exc: e.MlxcelError) -> dict[str, Any]:
    """The body of an error response, and the data of an SSE ``error`` event."""
    return {"type": "error", "error": {"type": error_type(exc), "message": exc.message,
                                       **exc.extra}}
