"""Errors that carry meaning; each dialect maps them to its own wire format."""

from __future__ import annotations


class MlxcelError(Exception):
    """Base class. ``status`` is the HTTP status a dialect should use."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.extra = extra or {}  # more fields for the error body (e.g. estimated_bytes)


class InvalidRequest(MlxcelError):
    status = 400
    type = "invalid_request_error"


class BodyTimeout(InvalidRequest):
    """The request body did not arrive within ``--body-timeout`` (a slow or stalled client)."""

    status = 408


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class CapabilityNotSupported(MlxcelError):
    status = 501
    type = "not_supported_error"


class NotFound(MlxcelError):
    status = 404
    type = "not_found_error"


class Unauthorized(MlxcelError):
    status = 401
    type = "invalid_api_key"


class Overloaded(MlxcelError):
    status = 503
    type = "server_busy"


class ModelLoading(Overloaded):
    """The model is still loading."""


class MemoryBudgetExceeded(MlxcelError):
    status = 503
    type = "request_memory_budget_exceeded"
    code = "request_memory_budget_exceeded"

    def __init__(self, estimated: int, budget: int) -> None:
        super().__init__(
            f"request_memory_budget_exceeded: estimated_bytes={estimated}, "
            f"budget_bytes={budget}; shorten the prompt/output or lower retained cache usage",
            extra={"estimated_bytes": estimated, "budget_bytes": budget})


class GenerationFailed(MlxcelError):
    status = 500
    type = "server_error"


class PluginError(Exception):
    """A plugin could not be loaded or registered something invalid."""


class StartupError(Exception):
    """The server cannot start; the message is shown to the user as one line."""


class UnknownModelType(StartupError):
    """No installed family claims the checkpoint's ``model_type``."""
