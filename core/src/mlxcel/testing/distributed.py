"""Distributed servers as subprocesses, for the e2e tests and the benchmark: ``--distributed``
ranks on MLX's ring backend over loopback, started either through ``mlxcel-server launch``
(``launcher=True``: MLX's own launcher, as a user starts them) or as one process per rank
with the environment the launcher gives its ranks (``MLX_RANK``, ``MLX_HOSTFILE``), so a
test can stop or kill one rank and read each rank's exit status.

Rank 0 is a ``Server`` (ready once ``/health`` answers 200); the other ranks' output goes
to their own log files. ``stop()`` ends every process group. Imports neither mlx nor httpx.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
from typing import Any

from .servers import HOST, Server, free_port, server_exe

# The ring's ports come from below Linux's default ephemeral range (32768-60999; macOS's
# starts at 49152): a port the kernel may hand to any process's outgoing connection can be
# taken between this check and the rank's own bind, which then fails with EADDRINUSE.
RING_PORTS = (20000, 32000)


def free_ports(n: int) -> list[int]:
    """``n`` consecutive free ports of 127.0.0.1 (mlx.launch's ring numbers them so),
    from ``RING_PORTS``."""
    pick = random.Random()
    for _ in range(200):
        first = pick.randrange(RING_PORTS[0], RING_PORTS[1] - n)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((HOST, port))
            return list(range(first, first + n))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def ring_hostfile(path: pathlib.Path, ports: list[int]) -> pathlib.Path:
    """The ring backend's hostfile (what mlx.launch writes to ``MLX_HOSTFILE``)."""
    path.write_text(json.dumps([[f"{HOST}:{p}"] for p in ports]), encoding="utf-8")
    return path


class DistributedServer:
    """``ranks`` mlxcel-server processes serving one model; ``args`` are the server's
    (``--model``, ``--distributed`` ...), ``--port`` is added."""

    def __init__(self, args: list[str], logdir: pathlib.Path, ranks: int = 2,
                 launcher: bool = True, env: dict[str, str] | None = None,
                 timeout: float = 120) -> None:
        self.port = free_port()
        self.logdir = pathlib.Path(logdir)
        self.env = {**os.environ, **(env or {})}
        self.followers: list[subprocess.Popen[bytes]] = []
        ring = free_ports(ranks)
        server_args = ["--port", str(self.port), *args]
        if launcher:
            argv = [server_exe(), "launch", "-n", str(ranks), "--hosts", HOST,
                    "--starting-port", str(ring[0]), "--", *server_args]
            self.rank0 = Server("mlxcel", argv, "/health", self.logdir, f"dist-{self.port}",
                                env=self.env, bind=False)
        else:
            hostfile = ring_hostfile(self.logdir / f"hosts-{self.port}.json", ring)
            env0 = {**self.env, "MLX_HOSTFILE": str(hostfile)}
            self.rank0 = Server("mlxcel", [server_exe(), *server_args], "/health",
                                self.logdir, f"dist-{self.port}-rank0",
                                env={**env0, "MLX_RANK": "0"}, bind=False)
            for rank in range(1, ranks):
                self.followers.append(self._follower(rank, server_args, env0))
        self.rank0.port, self.rank0.base = self.port, f"http://{HOST}:{self.port}"
        self.rank0.start()
        try:
            self.rank0.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _follower(self, rank: int, args: list[str], env: dict[str, str]) -> Any:
        log = self.logdir / f"dist-{self.port}-rank{rank}.log"
        with open(log, "wb") as out:
            return subprocess.Popen([server_exe(), *args], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    env={**env, "MLX_RANK": str(rank)})

    @property
    def base_url(self) -> str:
        return self.rank0.base

    def follower_log(self, rank: int = 1) -> str:
        path = self.logdir / f"dist-{self.port}-rank{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.rank0.stop()
        for proc in self.followers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
