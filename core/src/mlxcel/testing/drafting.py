"""A drafter distribution's exactness check inside a mixed batch, and a drafter registry
with chosen plugins, for the tests of drafters that live outside core (MTP heads,
assistants): the same prompts, join/leave pattern and assertions for every drafter.

``DraftFlags`` holds the settings ``mlxcel.drafters.select.choose`` reads, so a test can
ask which drafter flags pick without a whole ``Settings``; ``draft_target`` is what a
session is offered of a checkpoint; ``check_server_drafts`` asks the whole app for one
answer with and without the drafter.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcel.drafters.api import DraftTarget
from mlxcel.drafters.registry import DrafterRegistry
from mlxcel.engine.config import EngineConfig
from mlxcel.testing.engine import app_client, request, run_joining
from mlxcel.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [20, 21, 22, 23] * 3, [40, 41, 42] * 9,
           [100, 200, 100, 200, 100, 200], [60 + i % 7 for i in range(21)]]
SILENT = {3}  # rows that never draft (speculative.n_max 0)


class DraftFlags(msgspec.Struct):
    """The target (``-m``) and ``-md`` / ``--draft-kind`` / ``--spec-type``."""

    model: str | None = None
    model_draft: str | None = None
    draft_kind: str | None = None
    spec_type: str | None = None


def run_mixed(checkpoint: Any, config: EngineConfig | None = None
              ) -> tuple[list[list[int]], list[Any], Any]:
    """``PROMPTS`` greedy on 3 slots, one engine step between submits, so rows join a
    running batch and leave it at different times; rows in ``SILENT`` never draft.
    Returns each row's tokens, each finish's usage, and the worker."""
    reqs = [request(prompt, 24 + 3 * i, SamplingParams(temperature=0.0),
                    draft_max=0 if i in SILENT else None) for i, prompt in enumerate(PROMPTS)]
    return run_joining(checkpoint, reqs, config, parallel=3, chunk=16)


def check_greedy_beside_silent_rows(checkpoint: Any, config: EngineConfig, kind: str) -> None:
    """Greedy output with ``config``'s drafter equals the output without one, every
    drafting row ran verify rounds of ``kind``, and the silent rows none."""
    plain, _, _ = run_mixed(checkpoint)
    fast, usages, worker = run_mixed(checkpoint, config)
    assert fast == plain
    assert worker.spec is not None and not worker.spec.failed
    for i, usage in enumerate(usages):
        if i in SILENT:
            assert usage.draft_rounds == 0 and usage.draft_kind is None
        else:
            assert usage.draft_rounds > 0 and usage.draft_kind == kind, i


def check_server_drafts(checkpoint: Any, kind: str, **settings: Any) -> None:
    """The app serving ``checkpoint`` with ``settings`` (``model_draft``, ``spec_type``,
    ...) answers a greedy chat as it does without them, its ``timings`` saying it drafted
    with a drafter of ``kind``."""
    body = {"model": "tiny", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "count: one two three one two"}]}
    with app_client(checkpoint) as plain:
        want = plain.post("/v1/chat/completions", json=body).json()
    with app_client(checkpoint, **settings) as client:
        got = client.post("/v1/chat/completions", json=body)
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["choices"][0]["message"] == want["choices"][0]["message"]
    assert answer["timings"]["draft_kind"] == kind
    assert answer["timings"]["draft_n"] > 0


def draft_target(checkpoint: Any, **load: Any) -> DraftTarget:
    """What a drafter's session is offered of ``checkpoint`` (a path), loaded as the
    server loads it (``load``: ``load_checkpoint`` options, e.g. ``dtype``)."""
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins

    ckpt = load_checkpoint(str(checkpoint), load_plugins().families, **load)
    return DraftTarget(ckpt.model, ckpt.tokenizer, str(ckpt.path), dict(ckpt.config))


def registry_with(*plugins: Any) -> DrafterRegistry:
    """Core's built-in drafters plus those each of ``plugins`` registers."""
    from mlxcel.builtin import drafters as builtin

    reg = DrafterRegistry()
    for module in (builtin, *plugins):
        module.mlxcel_register_drafters(reg)
    return reg


def chi2_independence_p(table: list[list[int]]) -> float:
    """The p-value of Pearson's chi-squared test of independence on a 2 x k table (each
    row a run's counts per outcome: does speculation keep the target's distribution?; no
    scipy in core's test environment): the statistic against the chi-squared survival
    function, from the series of the regularised lower incomplete gamma function."""
    import math

    cols = [c for c in zip(*table, strict=True) if sum(c)]
    rows = [sum(r[i] for i, c in enumerate(zip(*table, strict=True)) if sum(c)) for r in table]
    total = sum(rows)
    stat = sum((c[r] - rows[r] * sum(c) / total) ** 2 / (rows[r] * sum(c) / total)
               for c in cols for r in range(len(rows)))
    k, x = (len(cols) - 1) / 2, stat / 2
    if k <= 0:
        return 1.0
    term = total_sum = 1.0 / k
    n = 0
    while term > 1e-16 * total_sum:
        n += 1
        term *= x / (k + n)
        total_sum += term
    lower = math.exp(k * math.log(x) - x - math.lgamma(k)) * total_sum if x > 0 else 0.0
    return max(0.0, 1.0 - lower)
