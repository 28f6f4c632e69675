"""create_app(settings) -> Litestar. Granian's factory target is ``app_from_env``."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from litestar import Litestar, Router

from mlxcel.context import AppContext
from mlxcel.cors import CorsPolicy
from mlxcel.dialects.shapes import ErrorShapes, router_handlers
from mlxcel.engine.client import EngineClient
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.prompt_cache import PromptCache
from mlxcel.http_guard import HostPolicy
from mlxcel.lazy import resolve
from mlxcel.logging import configure
from mlxcel.metrics import Metrics, metrics_route
from mlxcel.middleware import GuardConfig, ServerMiddleware
from mlxcel.plugins import Plugins, load_plugins
from mlxcel.serving import on_end_streams
from mlxcel.settings import Settings, failure_file

log = structlog.get_logger("mlxcel.app")
STREAM_FLUSH_S = 0.5  # how long open streams get to send their error frame before exit


def guard_config(settings: Settings, listening: bool,
                 shapes: ErrorShapes | None = None) -> GuardConfig:
    """The edge rules from the settings; the hosts of origins named by --cors-origins
    pass the Host/Origin guard too, since naming one is trusting it."""
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


def prompt_cache_from(settings: Settings) -> PromptCache:
    capacity = settings.prompt_cache_capacity_bytes or settings.cache_ram * (1 << 20)
    return PromptCache(capacity, settings.prompt_cache_max_entries, settings.prompt_cache_ttl,
                       enabled=not settings.no_cache_prompt)


def create_app(settings: Settings, plugins: Plugins | None = None,
               engine: EngineClient | None = None, listening: bool = False) -> Litestar:
    """The app; ``listening`` when Granian serves it on ``settings.host`` (an in-process app
    has no bind, so only ``--allowed-hosts`` restricts its Host names)."""
    plugins = plugins or load_plugins(settings.plugins, settings.disable_plugins)
    if engine is None:
        from mlxcel.model.loader import checkpoint_loader

        engine = EngineClient(
            checkpoint_loader(settings, plugins),
            parallel=settings.parallel, ctx_size=settings.ctx_size,
            prefill_chunk=settings.prefill_chunk(), max_queue_depth=settings.max_queue_depth,
            prompt_cache=prompt_cache_from(settings), config=EngineConfig.from_settings(settings))
    metrics = Metrics(engine)
    ctx = AppContext(settings=settings, plugins=plugins, engine=engine,
                     model_name=model_display_name(settings), metrics=metrics)
    shapes = ErrorShapes(plugins.dialects)
    handlers: list[Any] = []
    for name, dialect in plugins.dialects.items():
        handlers.append(Router("/", route_handlers=resolve(dialect.routes)(ctx),
                               exception_handlers=router_handlers(shapes.of_dialect[name])))
    if settings.metrics:
        handlers.append(metrics_route(metrics))
    startup: list[Any] = [engine.start]
    shutdown: list[Any] = [engine.shutdown]
    if settings.metrics_port > 0:  # the same registry on its own listener (no API key)
        startup.append(lambda: metrics.serve(settings.host, settings.metrics_port))
        shutdown.append(metrics.stop_serving)
    app = Litestar(
        route_handlers=handlers,
        exception_handlers=shapes.app_handlers(),
        on_startup=startup,
        on_shutdown=shutdown,
        state={"ctx": ctx},
        openapi_config=None,
        debug=False,
    )
    return guard_app(app, settings, listening, shapes)


def engine_failure(engine: EngineClient) -> tuple[str, bool] | None:
    """Wait for the engine thread to end: (the fatal message, whether it had been serving)
    when it failed, else None (a requested shutdown)."""
    engine.worker.ready.wait()
    loaded = engine.state == "ready"
    while engine.worker.is_alive() and engine.state != "failed":  # a distributed failure
        engine.worker.join(0.5)  # leaves the thread stuck in a collective: do not wait
    if engine.state != "failed":
        return None
    if loaded:
        return f"the engine stopped: {engine.worker.error}", True
    return f"the model failed to load: {engine.worker.error}", False


def _exit_on_engine_failure(engine: EngineClient, failure_path: str | None) -> None:
    """In the Granian worker: an engine that fails (at load or later) stops the whole server,
    with the reason handed to the CLI (which prints it and exits non-zero) in the file
    ``failure_path``."""

    def watch() -> None:
        failure = engine_failure(engine)
        if failure is None:
            return
        message, was_serving = failure
        log.error("engine_failed", error=message)
        if was_serving:  # let open streams send their error frames (and /health say why)
            time.sleep(STREAM_FLUSH_S + getattr(engine.worker.dist, "failure_hold_s", 0.0))
        if failure_path:
            with open(failure_path, "w", encoding="utf-8") as fh:
                fh.write(message)
        os.kill(os.getppid(), signal.SIGTERM)  # Granian's main process shuts down
        os._exit(3)

    threading.Thread(target=watch, name="mlxcel-engine-watch", daemon=True).start()


def _freeze_heap_once_loaded(engine: EngineClient) -> None:
    """Once the model has loaded, collect and then freeze what the process holds (modules,
    model, tokenizer, templates): a full collection stops every thread, the engine's too,
    for as long as it walks the heap, and after the freeze it walks only what serving
    made since, not the whole startup heap each time."""

    def freeze() -> None:
        engine.worker.ready.wait()
        if engine.state == "ready":
            gc.collect()
            gc.freeze()

    threading.Thread(target=freeze, name="mlxcel-gc-freeze", daemon=True).start()


def app_from_env() -> Litestar:
    """Granian factory: settings arrive from the CLI through the environment."""
    settings = Settings.from_env()
    configure(settings.log_format, secrets=[settings.api_key, *settings.api_keys()])
    app = create_app(settings, listening=True)
    engine = app.state["ctx"].engine
    _exit_on_engine_failure(engine, failure_file())
    _freeze_heap_once_loaded(engine)
    app.on_startup.append(lambda: on_end_streams(lambda: engine.worker.shutdown(timeout=0)))
    return app
