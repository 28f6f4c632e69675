"""--engine-trace (MLXCEL_ENGINE_TRACE): one JSON line per engine iteration that did work."""

from __future__ import annotations

import json

from mlxcel.engine.config import EngineConfig
from mlxcel.testing.engine import run_until_done, submit, worker_for


def traced_worker(path, trace: str | None):
    return worker_for(path, cache=True, parallel=8, config=EngineConfig(engine_trace=trace))


def test_trace_records_prefill_decode_and_store(path, tmp_path):
    out = tmp_path / "trace.jsonl"
    worker = traced_worker(path, str(out))
    sinks = [submit(worker, [5 + i] * 20, max_tokens=4) for i in range(2)]
    run_until_done(worker, sinks)
    worker.trace.flush()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["arrived"] == 2 and rows[0]["prefill_rows"] == 2
    assert rows[0]["prefill_cols"] == 20 and rows[0]["prefill_ms"] > 0
    # the first tokens come from the prompts' last logits, read back at the join
    assert rows[0]["joined"] == 2 and rows[0]["first_ms"] >= 0
    decode = [r for r in rows if "decode_rows" in r]
    # 3 more tokens each; the step after the last one is already built when they finish
    assert len(decode) in (3, 4) and all(r["decode_rows"] == 2 for r in decode)
    assert all(r["build_ms"] >= 0 and r["queue_ms"] >= 0 for r in decode)
    # the engine thread's CPU time in a phase, next to its wall time
    assert all(0 <= r["build_cpu_ms"] <= r["build_ms"] + 0.5 for r in decode)
    assert sum(r.get("stored", 0) for r in rows) == 2
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)


def test_no_trace_without_a_path(path):
    assert traced_worker(path, None).trace.enabled is False


def test_trace_times_a_verify_steps_phases(path, tmp_path):
    out = tmp_path / "trace.jsonl"
    config = EngineConfig(engine_trace=str(out), drafter="mlxcel.drafters.lookup:new_session",
                          prompt_lookup="on", draft_max=4)
    worker = worker_for(path, parallel=2, config=config)
    # a repeated passage: prompt lookup drafts from the second step on
    sinks = [submit(worker, list(range(20, 40)) * 3, max_tokens=24)]
    run_until_done(worker, sinks)
    worker.trace.flush()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    verify = [r for r in rows if "verify_ms" in r]
    assert verify, "no verify step ran"
    phases = ("verify_chain_ms", "verify_graph_ms", "verify_sync_ms", "verify_post_ms")
    for r in verify:
        assert r["propose_ms"] >= 0
        assert all(r[p] >= 0 and r[p.removesuffix("_ms") + "_cpu_ms"] >= 0 for p in phases)
        # the phases are consecutive parts of the step
        assert sum(r[p] for p in phases) <= r["verify_ms"] + 0.5
