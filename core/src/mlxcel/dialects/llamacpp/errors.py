"""llama-server's error body: the OpenAI shape (``mlxcel.dialects.openai.errors``), but a
prompt over the context is llama-server's own ``exceed_context_size_error``.

llama-server answers that case with HTTP 400 and
``{"error": {"code": 400, "message": "request (N tokens) exceeds the available context
size (M tokens), try increasing it", "type": "exceed_context_size_error",
"n_prompt_tokens": N, "n_ctx": M}}``; clients written for it match on the type or read the
two counts, so the native routes answer in exactly that shape. The message is built from
the counts the core error carries, never parsed out of its text.
"""

from __future__ import annotations

from typing import Any

from mlxcel import errors as e
from mlxcel.dialects.openai.errors import error_body as openai_error_body

EXCEED_CONTEXT = "exceed_context_size_error"


def error_body(exc: e.MlxcelError) -> dict[str, Any]:
    if isinstance(exc, e.ContextLengthExceeded) and exc.n_prompt_tokens is not None:
        n, ctx = exc.n_prompt_tokens, exc.n_ctx
        return {"error": {
            "code": exc.status,
            "message": f"request ({n} tokens) exceeds the available context size "
                       f"({ctx} tokens), try increasing it",
            "type": EXCEED_CONTEXT, "n_prompt_tokens": n, "n_ctx": ctx}}
    return openai_error_body(exc)
