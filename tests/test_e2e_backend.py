"""The real mlxcel-server re-executes itself with OpenBLAS preloaded on Linux CPU, says so
at startup (BLAS and dtype), and --no-fast-blas / MLXCEL_NO_FAST_BLAS leave it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlxcel import backend
from mlxcel.testing.servers import MlxcelServer as Server

LINUX = sys.platform.startswith("linux")
# what the server should end up with on this machine
FAST_BLAS = backend.find_fast_blas() if LINUX else None
_LIB = backend.mlx_library()
DEVICE = backend.mlx_device()
PRELOADS = bool(FAST_BLAS and _LIB and backend.links_blas(backend.elf_needed(_LIB))
                and DEVICE == "cpu")
# start the server as a user would: nothing preloaded yet (`make test` preloads pytest)
CLEAN_ENV = {"LD_PRELOAD": "", backend.REEXEC_MARKER: "", "MLXCEL_NO_FAST_BLAS": ""}

# Runs cli.main() as the console script would, with os.execve replaced by a probe.
_PROBE = """
import os, sys
def probe(exe, args, env):
    print("EXEC", env.get("LD_PRELOAD")); sys.stdout.flush(); os._exit(0)
os.execve = probe
sys.argv = ["mlxcel-server", *sys.argv[1:]]
from mlxcel.cli import main
try:
    code = main()
except SystemExit as exc:
    code = exc.code
print("NO EXEC", code)
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> str:
    env = {**os.environ, **CLEAN_ENV, "LLAMA_ARG_MODEL": "/definitely/not/here", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, env=env, timeout=60)
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args", [["-h"], ["--version"], ["plugins"], ["--no-fast-blas"]])
def test_no_reexec_outside_the_serving_path_or_when_opted_out(args):
    assert _probe(*args).startswith("NO EXEC")


def test_serving_path_reexecs_only_when_a_fast_blas_is_installed():
    out = _probe("--port", "1")
    assert out == (f"EXEC {FAST_BLAS}" if PRELOADS else "NO EXEC 2")
    assert _probe("--port", "1", env={"MLXCEL_NO_FAST_BLAS": "1"}) == "NO EXEC 2"
    assert _probe("--port", "1", env={backend.REEXEC_MARKER: "1"}) == "NO EXEC 2"


def _backend_event(srv: Server) -> dict:
    for line in srv.log().splitlines():
        if line.startswith("{") and '"backend"' in line:
            event = json.loads(line)
            if event.get("event") == "backend":
                return event
    raise AssertionError(f"no backend event in the log:\n{srv.log()}")


def _mapped(pid: int) -> str:
    """/proc/<pid>/maps of the server and its children (the Granian worker)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return "".join(Path(f"/proc/{p}/maps").read_text() for p in pids)


@pytest.mark.slow
@pytest.mark.parametrize("opt_out", [False, True])
def test_server_startup_names_blas_and_dtype(tiny_checkpoint, opt_out):
    args = ["--model", str(tiny_checkpoint), "--parallel", "1", "--log-format", "json"]
    srv = Server(args + (["--no-fast-blas"] if opt_out else []), env=CLEAN_ENV)
    try:
        event = _backend_event(srv)
        assert event["device"] == DEVICE
        # auto: float32 on CPU with OpenBLAS, else the (bfloat16) tiny checkpoint's own
        fast = PRELOADS and not opt_out
        assert event["dtype"] == ("float32" if fast else "bfloat16")
        assert event["requested_dtype"] == "auto"
        if LINUX:
            maps = _mapped(srv.proc.pid)
            if PRELOADS and not opt_out:
                assert event["blas"] == os.path.realpath(FAST_BLAS)
                assert os.path.realpath(FAST_BLAS) in maps and "openblas" in maps
            else:
                assert event["blas"] == backend.REFERENCE_BLAS
                assert not FAST_BLAS or os.path.realpath(FAST_BLAS) not in maps
    finally:
        srv.stop()


@pytest.mark.slow
def test_explicit_dtype_reaches_the_server(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--parallel", "1", "--log-format", "json",
                  "--dtype", "bfloat16"], env=CLEAN_ENV)
    try:
        event = _backend_event(srv)
        assert event["dtype"] == "bfloat16" and event["requested_dtype"] == "bfloat16"
    finally:
        srv.stop()
