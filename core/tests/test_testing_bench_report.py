"""The benches' shared report helpers (``mlxcel.testing.bench_report``)."""

from __future__ import annotations

import asyncio
import json
import math
import sys

import pytest
from mlxcel.testing.bench_report import (
    bench_versions,
    closed_loop,
    fmt,
    judge_targets,
    machine_line,
    ratio,
    write_report,
)
from mlxcel.testing.servers import Server


def test_the_closed_loop_runs_each_request_once_with_concurrency_in_flight():
    in_flight, peak = 0, 0

    async def one(client, i):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * (i % 3))
        in_flight -= 1
        return {"i": i, "client": client}

    recs, wall = asyncio.run(closed_loop("c", 3, 10, one))
    assert sorted(r["i"] for r in recs) == list(range(10))
    assert {r["client"] for r in recs} == {"c"} and peak == 3 and wall > 0


def test_targets_are_met_by_their_bound_and_never_by_a_missing_value():
    targets = [("up", ">=", 1.0), ("down", "<=", 0.5), ("absent", ">=", 1.0)]
    rows = judge_targets(targets, [1.0, 0.6, None])
    assert [r["met"] for r in rows] == [True, False, False]
    assert rows[1] == {"target": "down", "value": 0.6, "bound": "<= 0.5", "met": False}


def test_bench_versions_add_the_installed_dists_after_python():
    out = bench_versions("msgspec", "no-such-distribution-here")
    assert list(out)[-1] == "msgspec" and "python" in out
    assert "no-such-distribution-here" not in out


def test_the_report_is_written_as_json_and_markdown(tmp_path, capsys):
    report = {"machine": {"cpu": "x", "nproc": 2}, "versions": {"mlx": "1"},
              "loadavg_start": 0.1, "loadavg_end": 0.2}
    line = machine_line(report)
    assert line == "Machine: x (2 CPUs); mlx 1; load average 0.1 -> 0.2."
    out = tmp_path / "deep" / "r.json"
    write_report(out, report, line, tmp_path)
    assert json.loads(out.read_text()) == report
    assert out.with_suffix(".md").read_text() == line
    assert capsys.readouterr().out.startswith(line)


def test_table_numbers_and_ratios_treat_missing_nan_and_zero_alike():
    assert fmt(1.26, 1) == "1.3" and fmt(None) == "-" and fmt(math.nan) == "-"
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    assert ratio(math.nan, 1.0) is None and ratio(1.0, math.nan) is None


def test_a_server_that_never_gets_ready_is_stopped_by_launch(tmp_path):
    srv = Server("mute", [sys.executable, "-c", "import time; time.sleep(60)"], "/health",
                 tmp_path, "t", bind=False)
    with pytest.raises(TimeoutError, match="not ready"):
        srv.launch(timeout_s=1)
    assert srv.proc is not None and srv.proc.poll() is not None
