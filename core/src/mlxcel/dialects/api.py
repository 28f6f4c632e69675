"""API dialect contract: a set of routes with their own wire schemas and error shape."""

from __future__ import annotations

import msgspec


class Dialect(msgspec.Struct, frozen=True, kw_only=True):
    """``routes`` is a ``"module:attr"`` naming ``build(ctx: AppContext) -> list[handler]``:
    Litestar route handlers or Routers. Imported when the app is built; the app puts them
    in one Router whose exception handlers answer in this dialect's error shape.

    ``errors``: a ``"module:attr"`` naming ``error_body(exc: MlxcelError) -> dict``, the
    body of this dialect's error responses (core errors carry a status, a reason ``code``
    and a message, never a wire type). None: ``{"error": {"message", "code"}}``.

    ``prefixes``: the request paths this dialect owns: responses made outside any route
    (an unknown path or method, a refused key, Host or Content-Type) take the error shape
    of the dialect owning the longest matching prefix (the OpenAI dialect's elsewhere).
    """

    name: str
    routes: str
    description: str = ""
    errors: str | None = None
    prefixes: tuple[str, ...] = ()
