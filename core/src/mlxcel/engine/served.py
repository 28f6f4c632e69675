"""Prompt and generation totals of the requests the engine served, as llama-server's
``/metrics`` counts them (``llamacpp:`` families, ``mlxcel.metrics_llamacpp``).

Each request adds, when it finishes:

- its prompt tokens that were computed (the prompt less what the prompt cache gave) and
  the seconds from its prefill's start to its first token (the time it waited in the
  queue is not the prompt's, as llama-server counts it);
- its generated tokens, and the seconds from its first token to its last. The generation
  rate leaves the first token out on both sides (``steps``: tokens after the first), since
  that token's time is the prompt's.

Side models add their prompts too (embeddings and rerank, as llama-server counts them),
with the seconds their batches ran. Totals only grow; the *bucket* holds what was added
since the last scrape, which resets it (llama-server's throughput gauges average over the
window between two scrapes). Written from the engine thread, read from any.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Served:
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    cached_tokens: int = 0
    predicted_tokens: int = 0
    predicted_steps: int = 0  # generated tokens after each request's first
    predicted_seconds: float = 0.0  # from each request's first token to its last
    side_batches: int = 0  # forward passes of side models (embedding, rerank)

    def __add__(self, other: Served) -> Served:
        return Served(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                         for f in fields(self)})

    @property
    def prompt_rate(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def predicted_rate(self) -> float:
        return self.predicted_steps / self.predicted_seconds \
            if self.predicted_seconds > 0 else 0.0


class ServedTotals:
    """Running totals and the since-last-scrape bucket, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = Served()
        self._bucket = Served()

    def add(self, delta: Served) -> None:
        with self._lock:
            self._total = self._total + delta
            self._bucket = self._bucket + delta

    def request(self, prompt: int, cached: int, generated: int, started: float,
                first: float, last: float) -> None:
        """One finished generation: ``prompt`` tokens of which ``cached`` came from the
        prompt cache, ``generated`` tokens; ``started``: its prefill's start; times from
        ``time.perf_counter()``."""
        self.add(Served(prompt_tokens=max(0, prompt - cached), cached_tokens=cached,
                        prompt_seconds=max(0.0, first - started),
                        predicted_tokens=generated, predicted_steps=max(0, generated - 1),
                        predicted_seconds=max(0.0, last - first)))

    def side_batch(self, tokens: int, seconds: float) -> None:
        """One side-model forward over ``tokens`` prompt tokens."""
        self.add(Served(prompt_tokens=tokens, prompt_seconds=seconds, side_batches=1))

    def snapshot(self, reset_bucket: bool = False) -> tuple[Served, Served]:
        """(totals, bucket); ``reset_bucket`` starts a new window (a scrape)."""
        with self._lock:
            total, bucket = self._total, self._bucket
            if reset_bucket:
                self._bucket = replace(Served())
            return total, bucket
