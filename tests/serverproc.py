"""Start the real ``mlxcel-server`` process on a free port for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_exe() -> str:
    exe = Path(sys.executable).parent / "mlxcel-server"
    return str(exe) if exe.exists() else shutil.which("mlxcel-server") or "mlxcel-server"


class Server:
    """A running mlxcel-server; ``stop()`` terminates the whole process group."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 timeout: float = 90, preexec_fn=None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlxcel-e2e-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [server_exe(), "--port", str(self.port), *args],
            env={**os.environ, **(env or {})}, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=preexec_fn)
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
