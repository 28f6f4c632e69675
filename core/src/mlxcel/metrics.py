"""Prometheus metrics: request counters kept by the app, engine gauges read at scrape time.

Each app owns a :class:`Metrics` with its own ``CollectorRegistry`` (never the global one),
so several apps can live in one process. ``GET /metrics`` and the ``--metrics-port``
listener both render that registry with ``prometheus_client.generate_latest`` (text format
0.0.4): the spec's ``mlxcel_`` families, then llama-server's ``llamacpp:`` ones
(``mlxcel.metrics_llamacpp``). Both answers carry llama-server's ``Process-Start-Time-Unix``
header, which scrapers compare between scrapes to tell a restart (counters back at zero)
from a counter that went down: here the Unix time, in seconds, at which this process
loaded its metrics. (llama-server fills it from a monotonic clock, so clients treat it as
an opaque value that changes on restart; a Unix time serves them the same.)
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from litestar import Response, get
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlxcel.metrics_llamacpp import LlamacppCollector
from mlxcel.types import Finish

log = structlog.get_logger("mlxcel.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
START_HEADER = "Process-Start-Time-Unix"
PROCESS_START = int(time.time())
NOT_COUNTED = frozenset({"error", "cancelled"})  # finish reasons of no completed generation

# (name, type, help) in the order the spec lists them.
SPEC: tuple[tuple[str, str, str], ...] = (
    ("mlxcel_requests_total", "counter", "Total number of completed generation requests; "
     "chat completion streams cancelled by the client are excluded"),
    ("mlxcel_prompt_tokens_total", "counter", "Total prompt tokens processed"),
    ("mlxcel_completion_tokens_total", "counter",
     "Total completion tokens of the requests counted in mlxcel_requests_total"),
    ("mlxcel_generation_time_seconds_total", "counter", "Total generation time in seconds"),
    ("mlxcel_slots_total", "gauge", "Total number of parallel slots"),
    ("mlxcel_slots_available", "gauge", "Available parallel slots"),
    ("mlxcel_queue_depth", "gauge", "Current prefill queue depth"),
    ("mlxcel_batch_sequences_started", "counter", "Total sequences that entered prefill"),
    ("mlxcel_batch_sequences_completed", "counter",
     "Total sequences that completed generation"),
    ("mlxcel_batch_prefill_tokens_total", "counter", "Cumulative prefill tokens processed"),
    ("mlxcel_batch_decode_tokens_total", "counter", "Cumulative decode tokens generated"),
    ("mlxcel_batch_current_size", "gauge", "Current active batch size"),
    ("mlxcel_cache_pool_active", "gauge", "Active cache entries"),
)


class _CounterTag(str):
    """The type tag ``"counter"`` for a counter whose name has no ``_total`` suffix.

    ``generate_latest`` appends ``_total`` to the HELP/TYPE name of every metric whose type
    equals ``"counter"``; this tag prints as ``counter`` but compares unequal to it, so the
    family is written under its own name, as the spec shows.
    """

    def __eq__(self, other: object) -> bool:
        return other != "counter" and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _family(name: str, type_: str, help_: str, value: float) -> Metric:
    if type_ == "gauge":
        return GaugeMetricFamily(name, help_, value=value)
    if name.endswith("_total"):
        metric = Metric(name[: -len("_total")], help_, "counter")
    else:
        metric = Metric(name, help_, "counter")
        metric.type = _CounterTag("counter")
    metric.add_sample(name, {}, value)
    return metric


class RequestCounters:
    """Totals over counted requests; written from the event loop, read by any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.generation_seconds = 0.0

    def record(self, finish: Finish, started: float) -> None:
        """Count one generation from its finish; ``started`` is ``time.perf_counter()``
        taken at submit. Errors and cancellations are not completed generations."""
        if finish.reason in NOT_COUNTED:
            return
        elapsed = time.perf_counter() - started
        usage = finish.usage
        with self._lock:
            self.requests += 1
            if usage is not None:
                self.prompt_tokens += usage.prompt_tokens
                self.completion_tokens += usage.completion_tokens
            self.generation_seconds += elapsed

    def snapshot(self) -> tuple[int, int, int, float]:
        with self._lock:
            return (self.requests, self.prompt_tokens, self.completion_tokens,
                    self.generation_seconds)

# speculative decoding's counters (mlxcel.engine.verify), after the spec's families
DRAFTS: tuple[tuple[str, str, str], ...] = (
    ("mlxcel_draft_rounds_total", "Rows' speculative verify rounds", "draft_rounds"),
    ("mlxcel_draft_tokens_total", "Tokens drafted for verify rounds", "draft_tokens"),
    ("mlxcel_draft_accepted_total", "Drafted tokens the target accepted", "draft_accepted"),
)
# the governors' state (mlxcel.engine.spec_governors), read at scrape time
GOVERNOR: tuple[tuple[str, str], ...] = (
    ("mlxcel_draft_paused", "1 while the batch governor keeps a batch of the current size "
     "from drafting (verify steps cost more per token than plain ones), else 0"),
    ("mlxcel_draft_rows_backed_off", "Rows whose governor waits before probing again"),
)


def governor_values(engine: Any) -> tuple[int, int]:
    """(paused, rows backed off); 0s without a drafter, while loading, or if a read fails."""
    if engine is None or engine.state != "ready":
        return 0, 0
    try:
        spec = getattr(engine, "speculation", None)
        if spec is None:
            return 0, 0
        return int(bool(spec.paused(int(engine.active_count)))), int(spec.backed_off())
    except Exception:  # a scrape must never fail because of the engine's state
        log.warning("engine_read_failed", exc_info=True)
        return 0, 0


def engine_values(engine: Any) -> dict[str, int]:
    """Engine gauges and batch counters; all 0 without a chat model, while it loads, or if
    a read fails."""
    zero = dict.fromkeys(("slots_total", "slots_available", "queue_depth", "started",
                          "completed", "prefill_tokens", "decode_tokens", "active"), 0)
    if engine is None or engine.state != "ready":  # no chat model, or loading
        return zero
    try:
        parallel, active = int(engine.parallel), int(engine.active_count)
        stats = engine.stats
        return {
            "slots_total": parallel,
            "slots_available": max(0, parallel - active),
            "queue_depth": int(engine.queue_depth),
            "started": int(stats.sequences_started),
            "completed": int(stats.sequences_completed),
            "prefill_tokens": int(stats.total_prefill_tokens),
            "decode_tokens": int(stats.total_decode_tokens),
            "active": active,
        }
    except Exception:  # a scrape must never fail because of the engine's state
        log.warning("engine_read_failed", exc_info=True)
        return zero


class MlxcelCollector:
    """Custom collector: one family per spec metric, in the spec's order."""

    def __init__(self, counters: RequestCounters, engine: Any) -> None:
        self.counters = counters
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        requests, prompt, completion, seconds = self.counters.snapshot()
        e = engine_values(self.engine)
        values = (requests, prompt, completion, seconds, e["slots_total"],
                  e["slots_available"], e["queue_depth"], e["started"], e["completed"],
                  e["prefill_tokens"], e["decode_tokens"], e["active"],
                  e["active"])  # cache_pool_active: one cache per active sequence
        for (name, type_, help_), value in zip(SPEC, values, strict=True):
            yield _family(name, type_, help_, value)
        stats = getattr(self.engine, "stats", None) if self.engine is not None else None
        for name, help_, field in DRAFTS:
            yield _family(name, "counter", help_, int(getattr(stats, field, 0) or 0))
        for (name, help_), value in zip(GOVERNOR, governor_values(self.engine), strict=True):
            yield _family(name, "gauge", help_, value)


class Metrics:
    """An app's request counters, its registry, and the optional ``--metrics-port`` server."""

    def __init__(self, engine: Any, sides: dict[str, Any] | None = None) -> None:
        """``engine``: the chat model's EngineClient (None without one); ``sides``: the side
        models' engines by task, whose prompts the ``llamacpp:`` counters include."""
        self.counters = RequestCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MlxcelCollector(self.counters, engine))
        self.registry.register(LlamacppCollector(engine, sides))
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def record(self, finish: Finish, started: float) -> None:
        self.counters.record(finish, started)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- the separate listener (--metrics-port) -------------------------------------------
    def serve(self, host: str, port: int) -> None:
        """Serve this registry on ``host:port`` from a daemon thread.

        Like ``prometheus_client.start_http_server`` (same WSGI app and server class), but
        the text format 0.0.4 is always served: the OpenMetrics format (which the client
        would pick for a Prometheus scraper) cannot carry the spec's counters without a
        ``_total`` suffix.
        """
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        app = make_wsgi_app(self.registry)

        def text_only(environ: dict, start_response: Any) -> Any:
            environ.pop("HTTP_ACCEPT", None)

            def with_start(status: str, headers: list, *args: Any) -> Any:
                return start_response(status, [*headers, (START_HEADER, str(PROCESS_START))],
                                      *args)
            return app(environ, with_start)

        server_cls = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        self._server = make_server(sockaddr[0], port, text_only, server_cls,
                                   handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="mlxcel-metrics", daemon=True)
        self._thread.start()
        log.info("metrics_listener", host=host, port=port)

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_route(metrics: Metrics) -> Any:
    """``GET /metrics`` on the main port (behind the API key like any route)."""

    @get("/metrics")
    async def prometheus_metrics() -> Response:
        # an explicit header: Litestar would append a second charset to a text/* media type
        return Response(metrics.exposition(), media_type=CONTENT_TYPE,
                        headers={"content-type": CONTENT_TYPE,
                                 START_HEADER: str(PROCESS_START)})

    return prometheus_metrics


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass
