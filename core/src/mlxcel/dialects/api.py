"""API dialect contract: a set of routes with their own wire schemas and error shape."""

from __future__ import annotations

import msgspec


class Dialect(msgspec.Struct, frozen=True, kw_only=True):
    """``routes`` is a ``"module:attr"`` naming ``build(ctx: AppContext) -> list[handler]``:
    Litestar route handlers or Routers. Imported when the app is built."""

    name: str
    routes: str
    description: str = ""
