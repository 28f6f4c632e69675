"""create_app(settings) -> Litestar: the dialects' routers over the process's engines.
The Granian worker's lifecycle around it is ``mlxcel.serving``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from litestar import Litestar, Router

from mlxcel.context import AppContext
from mlxcel.cors import CorsPolicy
from mlxcel.dialects.shapes import ErrorShapes, router_handlers
from mlxcel.engine.client import EngineClient
from mlxcel.engines import Engines, build_engines
from mlxcel.http_guard import HostPolicy
from mlxcel.lazy import resolve
from mlxcel.metrics import Metrics, metrics_route
from mlxcel.middleware import GuardConfig, ServerMiddleware
from mlxcel.plugins import Plugins, load_plugins
from mlxcel.settings import Settings

log = structlog.get_logger("mlxcel.app")
MAX_BODY = 128 << 20  # a request body's bytes: a 64 MiB image as base64 and its JSON fit


def guard_config(settings: Settings, listening: bool,
                 shapes: ErrorShapes | None = None) -> GuardConfig:
    """The edge rules from the settings; the hosts of origins named by --cors-origins
    pass the Host guard too, since naming one is trusting it."""
    cors = CorsPolicy.from_flags(settings.cors_origins, settings.cors_methods,
                                 settings.cors_headers, settings.cors_credentials)
    hosts = HostPolicy.from_settings(settings.host, settings.allowed_hosts, listening)
    if hosts.names is not None:
        hosts = HostPolicy(hosts.names | cors.origin_hosts())
    return GuardConfig(api_keys=settings.api_keys(), hosts=hosts,
                       body_timeout=settings.body_timeout, write_timeout=settings.timeout,
                       error_body=(shapes or ErrorShapes({})).encode, cors=cors)


def guard_app(app: Litestar, settings: Settings, listening: bool = False,
              shapes: ErrorShapes | None = None) -> Litestar:
    """Put ``ServerMiddleware`` around Litestar's whole request handler (router and exception
    handling), not around matched routes only, so 404s and 405s pass the same checks.
    ``listening``: the app serves ``settings.host`` (the loopback Host check applies);
    ``shapes``: the dialects' error bodies by path."""
    app.asgi_handler = ServerMiddleware(app.asgi_handler,
                                        guard_config(settings, listening, shapes))
    return app


def model_display_name(settings: Settings) -> str:
    if settings.aliases():
        return settings.aliases()[0]
    if settings.model:
        return Path(settings.model.rstrip("/")).name or settings.model
    return "mlxcel"


def create_app(settings: Settings, plugins: Plugins | None = None,
               engine: EngineClient | None = None, listening: bool = False,
               engines: Engines | None = None) -> Litestar:
    """The app; ``listening`` when Granian serves it on ``settings.host`` (an in-process app
    has no bind, so only ``--allowed-hosts`` restricts its Host names). ``engine`` (tests)
    replaces the chat model's engine; ``engines`` replaces them all."""
    plugins = plugins or load_plugins(settings.plugins, settings.disable_plugins)
    engines = engines or build_engines(settings, plugins, chat=engine)
    metrics = Metrics(engines.chat, engines.sides)
    ctx = AppContext(settings=settings, plugins=plugins, engine=engines.chat,
                     sides=engines.sides, model_name=model_display_name(settings),
                     metrics=metrics)
    shapes = ErrorShapes(plugins.dialects)
    handlers: list[Any] = []
    for name, dialect in plugins.dialects.items():
        handlers.append(Router("/", route_handlers=resolve(dialect.routes)(ctx),
                               exception_handlers=router_handlers(shapes.of_dialect[name])))
    if settings.metrics:
        handlers.append(metrics_route(metrics))
    startup: list[Any] = [engines.start]
    shutdown: list[Any] = [engines.shutdown]
    if settings.metrics_port > 0:  # the same registry on its own listener (no API key)
        startup.append(lambda: metrics.serve(settings.host, settings.metrics_port))
        shutdown.append(metrics.stop_serving)
    app = Litestar(
        route_handlers=handlers,
        exception_handlers=shapes.app_handlers(),
        on_startup=startup,
        on_shutdown=shutdown,
        state={"ctx": ctx, "engines": engines},
        openapi_config=None,
        debug=False,
        # media parts and audio uploads are bounded by their own limits (--max-image-payload-
        # size, 25 MiB of audio, each a 400/413 naming it), under this whole-body bound
        request_max_body_size=MAX_BODY,
    )
    return guard_app(app, settings, listening, shapes)
