"""Routes the spec lists whose model this server has not loaded: each answers 501
``not_implemented`` in its dialect's error shape (the dialect's Router renders it), naming
what the route needs and the routes the server does serve, never a 404 that reads as a
wrong URL. A dialect that comes to serve one of these paths drops it from its list."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from litestar import Request, route

from mlxcel.errors import NoModelForRoute

PREFIX = "unserved:"  # the name of every handler made here


def _served(request: Request) -> str:
    """The app's paths that some real handler serves (Litestar's own OPTIONS handlers
    serve nothing), less the routes of tasks whose model is not loaded."""
    from mlxcel.context import TASK_ROUTES

    ctx = request.app.state.get("ctx")
    served = ctx.served_tasks() if ctx is not None else tuple(TASK_ROUTES)
    missing = {p for task, paths in TASK_ROUTES.items() if task not in served for p in paths}
    paths = {r.path for r in request.app.routes
             if any(not (h.name or "").startswith(PREFIX) and h.http_methods != {"OPTIONS"}
                    for h in r.route_handlers)} - missing
    return ", ".join(sorted(paths))


def unserved_routes(groups: Iterable[tuple[str, str, tuple[str, ...]]]) -> list[Any]:
    """One handler per ``(method, needed, paths)`` group; ``needed`` says what model the
    paths need (``"an embedding model"``)."""
    handlers = []
    for method, needed, paths in groups:
        def make(needed: str = needed) -> Any:
            async def handler(request: Request) -> None:
                raise NoModelForRoute(
                    f"{request.method} {request.url.path} needs {needed}, and this server "
                    f"has none loaded; it serves {_served(request)}")
            return handler
        handlers.append(route(list(paths), http_method=[method], status_code=501,
                              name=f"{PREFIX}{paths[0]}")(make()))
    return handlers
