"""The engine in a process of its own (``--engine-process on``): what is particular to it.

The shared end-to-end suites (OpenAI SDK, metrics and slots, admission) run in both engine
modes (``serverproc.ENGINE_MODES``); this file covers the engine process dying under a
running stream.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
from serverproc import Server

MSG = [{"role": "user", "content": "Count to one hundred."}]


def engine_pid(server: Server) -> int:
    """The spawned engine process in the server's process group."""
    pgid = os.getpgid(server.proc.pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ")
            if os.getpgid(int(entry)) == pgid and b"spawn_main" in cmd:
                return int(entry)
        except (OSError, ProcessLookupError):
            continue
    raise AssertionError("no engine process found")


def test_an_engine_process_that_dies_ends_streams_and_stops_the_server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "2", "--engine-process", "on"])
    try:
        body = {"messages": MSG, "stream": True, "max_tokens": 4000, "ignore_eos": True}
        lines: list[str] = []
        with httpx.Client(base_url=srv.base_url, timeout=30) as http, \
                http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 6:  # streaming: now the engine goes away
                    os.kill(engine_pid(srv), signal.SIGKILL)
        # the stream ended (no hang) and said why
        assert any("error" in line for line in lines[6:]), lines[-3:]
        deadline = time.time() + 30
        while srv.proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert srv.proc.returncode not in (None, 0)
        assert "the engine stopped" in srv.log()
    finally:
        srv.stop()
