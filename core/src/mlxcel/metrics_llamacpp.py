"""llama-server's ``llamacpp:`` metric families, beside the spec's ``mlxcel_`` ones.

Name for name, type for type and help for help as llama-server's ``/metrics`` writes them
(``server_task_result_metrics::to_metrics``), counters first, so a dashboard or alert
written for llama-server reads this server unchanged:

- ``prompt_tokens_total`` / ``prompt_seconds_total``: prompt tokens computed (the prompt
  cache's share left out) and the seconds from each request's prefill start to its first
  token (not its time in the queue), chat model and side models (embedding, rerank)
  together (``mlxcel.engine.served``);
- ``tokens_predicted_total`` / ``tokens_predicted_seconds_total``: generated tokens, and
  the seconds from each request's first token to its last;
- ``n_decode_total``: the model's forward calls: decode steps, prefill chunks and side
  model batches;
- ``prompt_tokens_seconds`` / ``predicted_tokens_seconds``: throughput since the previous
  scrape, which starts a new window (llama-server's bucket); the generation rate counts
  the tokens after each request's first, whose time is the prompt's;
- ``requests_processing`` / ``requests_deferred``: sequences holding a slot / waiting;
- ``n_busy_slots_per_decode``: rows per forward call. A decode step gives each busy row
  one token, plus the drafts it kept in a verify step; a prefill chunk is one call with at
  least one row: (decode tokens - kept drafts + prefill chunks) / (decode steps + prefill
  chunks). A prefill chunk that several rows share counts once, so it may read low.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import structlog
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from mlxcel.engine.served import Served

log = structlog.get_logger("mlxcel.metrics")

COUNTERS: tuple[tuple[str, str], ...] = (
    ("llamacpp:prompt_tokens_total",
     "Number of prompt tokens processed, excluding cached tokens"),
    ("llamacpp:prompt_seconds_total", "Total time spent processing prompts"),
    ("llamacpp:tokens_predicted_total", "Number of generation tokens processed"),
    ("llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("llamacpp:n_decode_total", "Total number of llama_decode() calls, excluding "
     "speculative decoding and multimodal decoding"),
)
GAUGES: tuple[tuple[str, str], ...] = (
    ("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("llamacpp:requests_processing", "Number of requests processing"),
    ("llamacpp:requests_deferred", "Number of requests deferred"),
    ("llamacpp:n_busy_slots_per_decode",
     "Average number of busy slots per llama_decode() call"),
)
SPEC: tuple[tuple[str, str, str], ...] = (
    *((name, "counter", help_) for name, help_ in COUNTERS),
    *((name, "gauge", help_) for name, help_ in GAUGES),
)


def _counter(name: str, help_: str, value: float) -> Metric:
    metric = Metric(name.removesuffix("_total"), help_, "counter")
    metric.add_sample(name, {}, value)
    return metric


def engine_counts(engine: Any) -> dict[str, int]:
    """The chat engine's step counters and slot gauges; 0 without a chat model, while it
    loads, or if a read fails."""
    zero = dict.fromkeys(("decode_steps", "prefill_chunks", "decode_tokens", "processing",
                          "deferred", "drafts_accepted"), 0)
    if engine is None or engine.state != "ready":
        return zero
    try:
        stats = engine.stats
        return {"decode_steps": int(stats.decode_steps_processed),
                "prefill_chunks": int(stats.prefill_chunks_processed),
                "decode_tokens": int(stats.total_decode_tokens),
                "drafts_accepted": engine.drafts_accepted,
                "processing": int(engine.active_count), "deferred": int(engine.queue_depth)}
    except Exception:  # a scrape must never fail because of the engine's state
        log.warning("engine_read_failed", exc_info=True)
        return zero


class LlamacppCollector:
    """The ``llamacpp:`` families of one app: its chat engine and side models.

    Each collection is a scrape, and starts a new throughput window."""

    def __init__(self, engine: Any, sides: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.sides = sides or {}

    def served(self) -> tuple[Served, Served]:
        sources = [s.served for s in self.sides.values()]
        if self.engine is not None:
            sources.append(self.engine.served)
        total, bucket = Served(), Served()
        for source in sources:
            t, b = source.snapshot(reset_bucket=True)
            total, bucket = total + t, bucket + b
        return total, bucket

    def collect(self) -> Iterator[Metric]:
        total, bucket = self.served()
        e = engine_counts(self.engine)
        calls = e["decode_steps"] + e["prefill_chunks"]
        rows = max(0, e["decode_tokens"] - e["drafts_accepted"]) + e["prefill_chunks"]
        busy = rows / calls if calls else 0.0
        counters = (total.prompt_tokens, total.prompt_seconds, total.predicted_tokens,
                    total.predicted_seconds, calls + total.side_batches)
        gauges = (bucket.prompt_rate, bucket.predicted_rate, e["processing"], e["deferred"],
                  busy)
        for (name, help_), value in zip(COUNTERS, counters, strict=True):
            yield _counter(name, help_, value)
        for (name, help_), value in zip(GAUGES, gauges, strict=True):
            yield GaugeMetricFamily(name, help_, value=value)
