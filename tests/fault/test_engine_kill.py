"""The engine's process killed mid-stream (as the OOM killer would): clients see their
streams end, the server exits non-zero in bounded time, and the port is free again."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import httpx
from conftest import worker_pids


def test_killing_the_engine_mid_stream_ends_streams_and_the_server(start_server):
    srv = start_server("--parallel", "2")
    ended: dict[str, object] = {}

    def stream():
        body = {"prompt": "x", "max_tokens": 100000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", srv.base_url + "/v1/completions", json=body,
                              timeout=httpx.Timeout(30, read=20)) as resp:
                for line in resp.iter_lines():
                    ended["last"] = line
        except httpx.HTTPError as exc:
            ended["error"] = type(exc).__name__
        ended["at"] = time.time()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    deadline = time.time() + 30
    while "last" not in ended:
        assert time.time() < deadline, "the stream never started"
        time.sleep(0.05)
    workers = [p for p in worker_pids(srv) if p != srv.proc.pid]
    assert workers, "no worker process found"
    killed = time.time()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    reader.join(15)
    assert not reader.is_alive(), "the stream hung after the engine died"
    assert ended["at"] - killed < 15
    code = srv.proc.wait(20)
    assert code != 0, "the server exited 0 after its engine was killed"
    with socket.socket() as probe:  # nothing is left listening on the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", srv.port))


DEATH = '''
"""Test-only: the served model kills the engine thread on a prefill holding the marker."""
import mlxcel.model.loader as loader
from mlxcel.testing.faults import raise_on_marker

_load = loader.load_checkpoint


class EngineDeath(BaseException):
    """Not an Exception: nothing on the step path may catch it."""


def load_checkpoint(*args, **kwargs):
    ckpt = _load(*args, **kwargs)
    raise_on_marker(ckpt, "<tool_call>", lambda: EngineDeath("the engine thread was killed"))
    return ckpt


loader.load_checkpoint = load_checkpoint
'''


def test_engine_thread_death_ends_streams_with_an_error_and_exits(start_server, tmp_path):
    """The engine thread itself dies mid-stream: the running stream gets an error frame,
    the server reports why on stderr and exits non-zero in bounded time."""
    (tmp_path / "sitecustomize.py").write_text(DEATH)
    srv = start_server("--parallel", "2", env={"PYTHONPATH": str(tmp_path)})
    frames: list[str] = []

    def stream():
        body = {"prompt": "x", "max_tokens": 100000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", srv.base_url + "/v1/completions", json=body,
                              timeout=httpx.Timeout(30, read=20)) as resp:
                frames.extend(resp.iter_lines())
        except httpx.HTTPError as exc:
            frames.append(f"transport error: {type(exc).__name__}")

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    deadline = time.time() + 30
    while not frames:
        assert time.time() < deadline, "the stream never started"
        time.sleep(0.05)
    killer = httpx.post(srv.base_url + "/v1/completions", timeout=30,
                        json={"prompt": "kill <tool_call> now", "max_tokens": 4})
    assert killer.status_code == 500 and "engine stopped" in killer.json()["error"]["message"]
    reader.join(15)
    assert not reader.is_alive(), "the stream hung after the engine thread died"
    errors = [f for f in frames if f.startswith("data: {") and '"error"' in f]
    assert errors and "engine stopped" in errors[-1], frames[-3:]
    assert frames[-1] in ("data: [DONE]", "") or frames[-1].startswith("transport"), frames[-3:]
    code = srv.proc.wait(20)
    assert code == 2, code
    assert "mlxcel-server: error: the engine stopped" in srv.log()
