"""What the benches share around their own
measurements: the closed loop of requests, the versions, the targets table, the table's
numbers and ratios, the machine line, the written report, and a harness loaded by a
probe.

A closed loop is how the benches load a server: ``concurrency`` workers over one client
take the next request as soon as their last one ends, so the server always has exactly
``concurrency`` requests in flight and the wall time covers them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import pathlib
import sys
import time
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .servers import versions


async def closed_loop(client: Any, concurrency: int, requests: int,
                      one: Callable[[Any, int], Awaitable[dict[str, Any]]],
                      ) -> tuple[list[dict[str, Any]], float]:
    """``one(client, i)`` for each i below ``requests``, ``concurrency`` at a time in a
    closed loop; the records in the order they ended, and the wall seconds."""
    counter = iter(range(requests))
    recs: list[dict[str, Any]] = []

    async def worker() -> None:
        for i in counter:
            recs.append(await one(client, i))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return recs, time.perf_counter() - t0


def bench_versions(*dists: str) -> dict[str, str]:
    """``servers.versions()`` and then those of ``dists`` (the bench's own distributions)
    that are installed."""
    out = versions()
    for dist in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def judge_targets(targets: Sequence[tuple[str, str, float]],
                  values: Sequence[float | None]) -> list[dict[str, Any]]:
    """Each ``(what, op, bound)`` of ``targets`` against its value (``op`` is ``>=`` or
    ``<=``); a missing value is not met."""
    out = []
    for (what, op, bound), value in zip(targets, values, strict=True):
        met = value is not None and (value >= bound if op == ">=" else value <= bound)
        out.append({"target": what, "value": value, "bound": f"{op} {bound}", "met": met})
    return out


def fmt(v: float | None, nd: int = 0) -> str:
    """A number for a results table; ``-`` for a missing or NaN value."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing, NaN or ``b`` is zero."""
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def machine_line(report: dict[str, Any]) -> str:
    """The report's machine, versions and load averages as one line of its Markdown."""
    m, ver = report["machine"], report["versions"]
    return (f"Machine: {m.get('gpu') or m['cpu']} ({m['nproc']} CPUs); "
            + ", ".join(f"{k} {v}" for k, v in ver.items())
            + f"; load average {report['loadavg_start']} -> {report['loadavg_end']}.")


def write_report(out: pathlib.Path, report: dict[str, Any], markdown: str,
                 logdir: pathlib.Path) -> None:
    """``report`` as JSON at ``out`` and ``markdown`` beside it (``.md``); the Markdown is
    printed, then where both went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"wrote {out}; logs in {logdir}")


def harness(path: pathlib.Path, name: str) -> types.ModuleType:
    """The bench harness at ``path`` (bench/ is no package), loaded from its file once and
    registered as ``name``, so a probe can use its workload and functions, and processes
    spawned from the probe unpickle them by that name."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
