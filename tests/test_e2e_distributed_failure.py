"""Distributed serving when a rank fails: the real ``mlxcel-server`` ranks (one process
per rank, on the environment MLX's launcher gives them, so a test can kill one), the
ring backend over loopback, and the real ``openai`` SDK.

A follower killed mid-stream ends every open stream with the engine's error event,
``/health`` says which rank failed, and rank 0 exits non-zero in bounded time; a
follower that hangs does the same after ``--distributed-timeout``; a follower exits
non-zero when rank 0 dies; a requested shutdown ends every rank with 0; a model that
cannot run in the asked mode refuses to start with one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest
from mlxcel.testing import cached_checkpoint
from mlxcel.testing.distributed import DistributedServer
from mlxcel.testing.servers import free_port, server_exe

pytestmark = pytest.mark.slow
EXIT_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def llama(mlxcel_checkpoint_cache):
    return str(cached_checkpoint("llama", mlxcel_checkpoint_cache, dtype="float32",
                                 num_layers=3, suppress_eos=True))


def start(ckpt: str, tmp_path, *extra: str) -> DistributedServer:
    return DistributedServer(["--model", ckpt, "--parallel", "2", "--distributed", "tensor",
                              *extra], tmp_path, launcher=False)


def open_streams(base: str, n: int) -> tuple[list[dict], threading.Event]:
    """``n`` long streams in threads; the event is set once each has text."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    outcomes = [{"chunks": 0} for _ in range(n)]
    going = threading.Barrier(n + 1)

    def run(out: dict) -> None:
        try:
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Go on."}],
                max_tokens=3500, temperature=0, stream=True)
            for chunk in stream:
                out["chunks"] += 1
                if out["chunks"] == 2:
                    going.wait(30)
                if chunk.choices and chunk.choices[0].finish_reason:
                    out["finish"] = chunk.choices[0].finish_reason
        except openai.APIError as exc:
            out["error"] = exc.message
        except threading.BrokenBarrierError:
            out["error"] = "never started"

    threads = [threading.Thread(target=run, args=(o,), daemon=True) for o in outcomes]
    for t in threads:
        t.start()
    going.wait(60)
    outcomes.append({"threads": threads})
    return outcomes, going


def joined(outcomes: list[dict]) -> list[dict]:
    for t in outcomes.pop()["threads"]:
        t.join(60)
    return outcomes


def wait_exit(proc, limit: float = EXIT_WITHIN_S) -> tuple[int, float]:
    t0 = time.monotonic()
    code = proc.wait(limit)
    return code, time.monotonic() - t0


def test_a_killed_follower_fails_the_streams_health_and_the_server(llama, tmp_path):
    dist = start(llama, tmp_path)
    try:
        outcomes, _ = open_streams(dist.base_url, 2)
        os.killpg(dist.followers[0].pid, signal.SIGKILL)
        outcomes = joined(outcomes)
        for out in outcomes:
            assert "finish" not in out and "distributed tensor over 2 ranks" in out["error"]
        health = httpx.get(dist.base_url + "/health", timeout=5)
        assert health.status_code == 503
        body = health.json()
        assert body["distributed"]["status"] == "failed" and "rank 1" in body["error"]
        code, took = wait_exit(dist.rank0.proc)
        assert code != 0 and took < EXIT_WITHIN_S
    finally:
        dist.stop()


def test_a_hung_follower_times_out_instead_of_hanging(llama, tmp_path):
    dist = start(llama, tmp_path, "--distributed-timeout", "3")
    follower = dist.followers[0]
    try:
        outcomes, _ = open_streams(dist.base_url, 1)
        os.killpg(follower.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        (out,) = joined(outcomes)
        assert "--distributed-timeout 3" in out["error"]
        assert time.monotonic() - stopped < 15
        code, _ = wait_exit(dist.rank0.proc)
        assert code != 0
    finally:
        os.killpg(follower.pid, signal.SIGKILL)
        dist.stop()


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of the launcher's child that runs ``rank`` (MLX_RANK in its environment)."""
    for task in os.listdir(f"/proc/{launcher_pid}/task"):
        with open(f"/proc/{launcher_pid}/task/{task}/children") as fh:
            for pid in map(int, fh.read().split()):
                with open(f"/proc/{pid}/environ", "rb") as env:
                    if f"MLX_RANK={rank}".encode() in env.read().split(b"\0"):
                        return pid
    raise AssertionError(f"no rank {rank} under the launcher")


def test_the_launcher_exits_when_a_rank_fails_beside_a_hung_one(llama, tmp_path):
    """Rank 0 fails at the distributed timeout beside a stopped follower: the launcher
    stops the follower and exits with rank 0's status, instead of waiting for it."""
    dist = DistributedServer(["--model", llama, "--parallel", "2", "--distributed", "tensor",
                              "--distributed-timeout", "3"], tmp_path, launcher=True)
    follower = rank_pid(dist.rank0.proc.pid, 1)
    try:
        outcomes, _ = open_streams(dist.base_url, 1)
        os.kill(follower, signal.SIGSTOP)
        (out,) = joined(outcomes)
        assert "--distributed-timeout 3" in out["error"]
        code, took = wait_exit(dist.rank0.proc)
        assert code == 2 and took < EXIT_WITHIN_S, (code, took)
        assert not os.path.exists(f"/proc/{follower}") or \
            open(f"/proc/{follower}/stat").read().split()[2] == "Z"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(follower, signal.SIGKILL)
        dist.stop()


def test_a_follower_exits_when_rank_0_dies(llama, tmp_path):
    dist = start(llama, tmp_path)
    try:
        os.killpg(dist.rank0.proc.pid, signal.SIGKILL)
        code, took = wait_exit(dist.followers[0])
        assert code != 0 and took < EXIT_WITHIN_S
        assert "distributed_follower_exit" in dist.follower_log()
    finally:
        dist.stop()


def test_a_requested_shutdown_ends_every_rank_with_status_0(llama, tmp_path):
    dist = start(llama, tmp_path)
    try:
        r = httpx.post(dist.base_url + "/v1/completions", timeout=60,
                       json={"prompt": "hi there", "max_tokens": 8})
        assert r.status_code == 200
        os.kill(dist.rank0.proc.pid, signal.SIGTERM)
        assert wait_exit(dist.rank0.proc)[0] == 0
        assert wait_exit(dist.followers[0])[0] == 0
        assert "distributed_follower_stopped" in dist.follower_log()
    finally:
        dist.stop()


@pytest.mark.parametrize(("shape", "mode", "says"), [
    ("qwen3", "pipeline", "it supports tensor only"),
    ("mamba", "tensor", "it supports neither tensor nor pipeline mode"),
])
def test_a_mode_the_model_lacks_is_a_one_line_startup_error(mlxcel_checkpoint_cache, shape,
                                                            mode, says):
    ckpt = cached_checkpoint(shape, mlxcel_checkpoint_cache)
    proc = subprocess.run([server_exe(), "--model", str(ckpt), "--distributed", mode,
                           "--port", str(free_port())], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "mlxcel-server: error:" in line]
    assert len(errors) == 1 and f"cannot run in {mode} mode" in errors[0]
    assert says in errors[0] and "Traceback" not in proc.stderr
