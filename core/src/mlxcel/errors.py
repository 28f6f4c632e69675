"""Errors that carry meaning only: an HTTP status, a reason ``code`` where the spec names
one, the message and its fields. No wire ``type`` string lives here: each dialect maps
these classes to its own error body (``Dialect.errors``; the OpenAI one is
``mlxcel.dialects.openai.errors``)."""

from __future__ import annotations


class MlxcelError(Exception):
    """Base class. ``status`` is the HTTP status a dialect should use."""

    status = 500
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


class BodyTimeout(InvalidRequest):
    """The request body did not arrive within ``--body-timeout`` (a slow or stalled client)."""

    status = 408


class ContextLengthExceeded(InvalidRequest):
    """A prompt that leaves no room in the context. ``n_prompt_tokens`` (its length, or a
    lower bound when it was refused before tokenizing) and ``n_ctx`` (the per-slot context)
    go into the error body as llama-server names them, so a client can shorten it by the
    right amount without parsing the message."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None,
                 n_prompt_tokens: int | None = None, n_ctx: int | None = None) -> None:
        counts = {} if n_prompt_tokens is None or n_ctx is None else \
            {"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx}
        super().__init__(message, param=param, extra=counts)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class UnsupportedSchema(InvalidRequest):
    """A constraint's schema uses a feature the grammar engine cannot enforce (``not``,
    ``if``/``then``/``else``, ...) or is one that no output satisfies; the message names
    the feature, never the schema."""


class ConstraintTooComplex(InvalidRequest):
    """A constraint is over a size limit, or did not compile within
    ``--grammar-compile-timeout``: refused instead of stalling the requests behind it."""


class UnsupportedTokenizer(InvalidRequest):
    """Constrained decoding needs token bytes this model's tokenizer cannot give; the
    message starts with ``UnsupportedTokenizer``, as the spec says."""


class CapabilityNotSupported(MlxcelError):
    status = 501


class NoModelForRoute(MlxcelError):
    """A route of the spec that needs a model this server has not loaded (embeddings,
    speech, images, ...): 501, the message naming what it needs and what the server
    serves, rather than a 404 that reads as a wrong URL."""

    status = 501


class NotFound(MlxcelError):
    status = 404


class Unauthorized(MlxcelError):
    status = 401


class MissingApiKey(Unauthorized):
    code = "missing_api_key"


class InvalidApiKey(Unauthorized):
    code = "invalid_api_key"


class Forbidden(MlxcelError):
    """The Host or Origin is not allowed (``mlxcel.http_guard``)."""

    status = 403


class MethodNotAllowed(InvalidRequest):
    status = 405


class PayloadTooLarge(InvalidRequest):
    status = 413


class UnsupportedMediaType(InvalidRequest):
    status = 415


class Overloaded(MlxcelError):
    status = 503


class RequestTimedOut(MlxcelError):
    """A queued side job (an embedding, a rerank, ...) was not answered within its task's
    timeout; the engine drops what it had not yet run."""

    status = 504


class ModelLoading(Overloaded):
    """The model is still loading."""


class MemoryBudgetExceeded(MlxcelError):
    status = 503
    code = "request_memory_budget_exceeded"

    def __init__(self, estimated: int, budget: int) -> None:
        super().__init__(
            f"request_memory_budget_exceeded: estimated_bytes={estimated}, "
            f"budget_bytes={budget}; shorten the prompt/output or lower retained cache usage",
            extra={"estimated_bytes": estimated, "budget_bytes": budget})


class GenerationFailed(MlxcelError):
    status = 500


class TokenOutOfVocabulary(MlxcelError):
    """``/detokenize`` got an id outside ``[0, vocab_size)``: 500 ``server_error``, as the
    spec and llama-server answer it (a 400 is for ids in a prompt)."""

    status = 500


class ServerError(MlxcelError):
    """Anything unexpected: the message never carries internals."""

    def __init__(self, message: str = "Internal server error") -> None:
        super().__init__(message)


class PluginError(Exception):
    """A plugin could not be loaded or registered something invalid."""


class StartupError(Exception):
    """The server cannot start; the message is shown to the user as one line."""


class UnknownModelType(StartupError):
    """No installed family claims the checkpoint's ``model_type``."""
