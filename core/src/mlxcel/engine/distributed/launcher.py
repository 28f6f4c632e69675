"""Starting the ranks: ``mlxcel-server launch`` runs MLX's own launcher (``mlx.launch``,
``mlx._distributed_utils.launch``) with ``mlxcel-server`` as every rank's program, and each
rank learns from its launcher's environment whether it serves HTTP (rank 0) or follows.

This module imports no MLX: the CLI reads the rank before Granian forks its worker, and a
CUDA device initialised before that fork cannot be used in the worker.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlxcel.backend import library_env

# what MLX's launchers set in each rank's environment (mlx.launch; Open MPI; MPICH)
RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LAUNCH_BACKENDS = ("ring", "jaccl", "jaccl-ring", "nccl", "mpi")
TERMINATE_GRACE_S = 5.0  # a rank told to stop may take this long before SIGKILL


def launcher_rank() -> int:
    """This process's rank as its launcher set it (0 when none did)."""
    env = library_env()
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxcel-server launch",
        description="Start mlxcel-server on every rank with MLX's launcher (mlx.launch); "
                    "the arguments after -- are the server's (they must set --distributed).")
    parser.add_argument("--hostfile", help="mlx.launch's JSON hostfile (hosts, IPs, RDMA)")
    parser.add_argument("--backend", choices=LAUNCH_BACKENDS,
                        help="mx.distributed backend (default: the hostfile's, else ring or "
                             "nccl on CUDA)")
    parser.add_argument("-n", "--repeat-hosts", type=int, default=None,
                        help="ranks per host (e.g. -n 2 --hosts 127.0.0.1: two local ranks)")
    parser.add_argument("--hosts", default=None, help="comma-separated hosts (no hostfile)")
    parser.add_argument("--starting-port", "-p", type=int, default=None,
                        help="ring/jaccl: first port, one more per rank and IP")
    parser.add_argument("--python", default=None,
                        help="the interpreter on the other hosts (default: mlxcel-server's "
                             "console script at this path)")
    parser.add_argument("--verbose", action="store_true")
    return parser


def launcher_argv(args: argparse.Namespace, server_args: Sequence[str]) -> list[str]:
    """mlx.launch's command line for ``args`` and the server's arguments."""
    out: list[str] = []
    for flag, value in (("--hostfile", args.hostfile), ("--backend", args.backend),
                        ("-n", args.repeat_hosts), ("--hosts", args.hosts),
                        ("--starting-port", args.starting_port)):
        if value is not None:
            out += [flag, str(value)]
    out += ["--verbose"] if args.verbose else []
    program = [args.python, "-m", "mlxcel.cli"] if args.python else [server_program()]
    return [*out, "--", *program, *server_args]


def server_program() -> str:
    """This environment's ``mlxcel-server`` console script (the same path on every host)."""
    exe = Path(sys.executable).parent / "mlxcel-server"
    return str(exe) if exe.exists() else "mlxcel-server"


def launch(argv: Sequence[str], check_server_args: Callable[[list[str]], None]) -> int:
    """``mlxcel-server launch [launcher options] -- <server options>``: run MLX's launcher;
    its exit status is the first non-zero exit status of a rank (0 when all ended well).
    ``check_server_args`` (the CLI's) refuses server options that would not split the
    model, before any rank starts."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = launch_parser().parse_args(argv[:split])
    server_args = argv[split + 1:]
    check_server_args(server_args)
    return run_mlx_launch(launcher_argv(args, server_args))


def run_mlx_launch(argv: list[str]) -> int:
    """MLX's launcher in this process, with each rank's exit status kept: MLX's own
    ``main`` reports them in its log only. Once a rank exits non-zero, MLX's launcher
    stops the others; ``recorded_process`` makes that stop end a rank that hangs."""
    from mlx._distributed_utils import launch as mlx_launch

    statuses: list[Any] = []
    base = getattr(mlx_launch, "RemoteProcess", None)
    if base is not None:
        mlx_launch.RemoteProcess = recorded_process(base, statuses)
    saved, sys.argv = sys.argv, ["mlx.launch", *argv]
    try:
        mlx_launch.main()
    finally:
        sys.argv = saved
        if base is not None:
            mlx_launch.RemoteProcess = base
    codes = [code if not killed else 1 for code, killed in statuses]
    return next((abs(code) or 1 for code in codes if code), 0)


def recorded_process(base: type, statuses: list[Any]) -> type:
    """MLX's ``RemoteProcess`` with each rank's exit status appended to ``statuses``, and
    a ``terminate`` that cannot wait forever. MLX's sends SIGTERM and waits for the rank
    without a limit, so a stopped or hung rank (SIGTERM stays pending while a process is
    stopped) kept the launcher alive after another rank had failed. Here the rank gets
    SIGTERM and SIGCONT, then SIGKILL after ``TERMINATE_GRACE_S``."""
    class Recorded(base):  # type: ignore[misc, valid-type]
        @property
        def exit_status(self) -> Any:
            status = super().exit_status
            if status[0] is not None:
                statuses.append(status)
            return status

        def terminate(self) -> None:
            if self._killed:
                return
            proc = self._process  # the rank itself on this host (exec), else ssh
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if self._pidfile is None:
                return
            cmd = kill_script(self._pidfile)
            if not self._is_local:
                cmd = f"ssh {shlex.quote(self._host)} {shlex.quote(cmd)}"
            done = subprocess.run(cmd, shell=True, executable="/bin/bash",
                                  capture_output=True, text=True, check=False)
            self._killed = done.stdout.strip() == "1"

    return Recorded


def kill_script(pidfile: str) -> str:
    """Ends the rank whose pid is in ``pidfile`` (on its host): SIGTERM and SIGCONT, then
    SIGKILL if it still runs after the grace; prints 1 when it was running."""
    pid = f"$(cat {shlex.quote(pidfile)})"
    return (f"pid={pid}; if ps -p $pid >/dev/null; then kill $pid; kill -CONT $pid; "
            f"for _ in $(seq {int(TERMINATE_GRACE_S * 10)}); do "
            "ps -p $pid >/dev/null || break; sleep 0.1; done; "
            "kill -KILL $pid 2>/dev/null; echo 1; else echo 0; fi; "
            f"rm -f {shlex.quote(pidfile)}")
