"""Fault scenarios against the real ``mlxcel-server`` process (all marked slow).

Every scenario has a fixed count and a deadline, and ends with :func:`assert_no_leak`:
the server is idle again (``/health``), every slot is free (``/slots``), the engine gauges
in ``/metrics`` agree, and the worker's RSS grew by less than a bound.
"""

from __future__ import annotations

import time

import httpx
import pytest
from mlxcel.testing.procs import rss_bytes, tree_pids  # noqa: F401 - the scenarios import it
from mlxcel.testing.servers import MlxcelServer as Server

RSS_GROWTH_LIMIT = 512 << 20  # bytes the worker may grow by over one scenario


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/fault/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)


def worker_pids(server: Server) -> list[int]:
    """The server's process and its descendants (Granian's worker runs the engine)."""
    return tree_pids(server.proc.pid)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} missing")


def assert_no_leak(server: Server, rss_before: int, headers: dict | None = None,
                   deadline: float = 30.0) -> None:
    """Idle again within ``deadline`` s: no active or queued sequence, every slot free,
    gauges consistent, RSS within ``RSS_GROWTH_LIMIT`` of ``rss_before``."""
    end = time.time() + deadline
    while True:
        health = httpx.get(server.base_url + "/health", timeout=5).json()
        batch = health.get("batch", {})
        if health.get("status") == "ok" and batch.get("active_sequences") == 0 \
                and batch.get("queue_depth") == 0:
            break
        assert time.time() < end, f"server not idle after the scenario: {health}"
        time.sleep(0.2)
    slots = httpx.get(server.base_url + "/slots", headers=headers, timeout=5).json()
    assert all(s["state"] == "idle" for s in slots), slots
    text = httpx.get(server.base_url + "/metrics", headers=headers, timeout=5).text
    assert metric(text, "mlxcel_slots_available") == metric(text, "mlxcel_slots_total")
    assert metric(text, "mlxcel_queue_depth") == 0
    assert metric(text, "mlxcel_batch_current_size") == 0
    grown = rss_bytes(server) - rss_before
    assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown >> 20} MiB"


@pytest.fixture
def start_server(tiny_checkpoint):
    """``start_server(*args, env=...)`` -> a running Server (``--slots --metrics`` on);
    every server started is stopped at teardown."""
    started: list[Server] = []

    def start(*args: str, env: dict | None = None) -> Server:
        srv = Server(["--model", str(tiny_checkpoint), "--slots", "--metrics", *args], env=env)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
