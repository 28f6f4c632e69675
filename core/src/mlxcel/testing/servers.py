"""Servers as subprocesses, for benchmarks and end-to-end tests: ``mlxcel-server`` or
``mlx_lm.server`` (``Server``), the real ``mlxcel-server`` console script started and ready
(``MlxcelServer``, the e2e tests' server), a streamed chat client that records chunk times,
and the machine facts a result records (the bench checkpoints are in
``mlxcel.testing.bench_checkpoints``).

Each server runs in its own process group on a free 127.0.0.1 port with its output in a
log file, and ``stop()`` ends the whole group: a benchmark must never leave a server (or
its Granian workers) behind. Importing this module imports neither mlx nor numpy nor
httpx (``mlxcel.testing``'s rule; httpx is a dev dependency), so each is imported where
it is used.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = float(os.environ.get("SERVING_STARTUP_TIMEOUT_S", "600"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_argv(
    name: str,
    model: str | os.PathLike,
    parallel: int = 1,
    dtype: str | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> tuple[list[str], str]:
    """(argv, readiness path) for ``mlxcel`` or ``mlx_lm``, run on this interpreter so the
    same venv serves both; mlxcel's readiness is /health (503 while loading)."""
    if name == "mlxcel":
        argv = [sys.executable, "-m", "mlxcel.cli", "--model", str(model)]
        argv += ["--parallel", str(parallel)] + (["--dtype", dtype] if dtype else [])
        return [*argv, *extra], "/health"
    if name == "mlx_lm":
        argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), *extra]
        return argv, "/v1/models"
    raise ValueError(f"unknown server {name!r}")


class Server:
    """One server subprocess in its own process group; output goes to a log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        ready_path: str,
        logdir: pathlib.Path,
        tag: str,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        bind: bool = True,
        preexec_fn: Any = None,
    ):
        """``bind``: append ``--host 127.0.0.1 --port P``; without it, ``argv`` must
        carry ``--port`` ``self.port`` itself (an e2e test may choose its own host)."""
        self.name = name
        self.env = env
        self.cwd = cwd
        self.preexec_fn = preexec_fn
        self.port = free_port()
        self.argv = [*argv, "--host", HOST, "--port", str(self.port)] if bind else list(argv)
        self.ready_path = ready_path
        self.base = f"http://{HOST}:{self.port}"
        self.log_path = pathlib.Path(logdir) / f"{tag}-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
                env=self.env,
                preexec_fn=self.preexec_fn,
            )

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> float:
        """Seconds until the readiness path answers 200; raises if the process exits or
        keeps answering 5xx other than 503 (the model failed to load)."""
        import httpx

        t0 = time.perf_counter()
        errors = 0
        with httpx.Client(trust_env=False) as client:
            while time.perf_counter() < t0 + timeout_s:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    code = client.get(self.base + self.ready_path, timeout=2.0).status_code
                    if code == 200:
                        return time.perf_counter() - t0
                    errors = errors + 1 if code >= 500 and code != 503 else 0
                    if errors >= 40:
                        raise RuntimeError(
                            f"{self.name}: {self.ready_path} answers {code}:\n{self.log_tail()}"
                        )
                time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def launch(self, timeout_s: float = STARTUP_TIMEOUT_S) -> float:
        """``start``, then ``wait_ready``'s seconds; a server that never gets ready is
        stopped, so that a failed start leaves no process behind."""
        self.start()
        try:
            return self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue

    @property
    def base_url(self) -> str:
        return self.base

    def log(self) -> str:
        """The whole log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def log_grep(self, word: str) -> list[str]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ln.strip() for ln in lines if word in ln][:3]


def same_blas_env() -> dict[str, str] | None:
    """The environment mlxcel gives itself on a Linux CPU (OpenBLAS preloaded,
    ``mlxcel.backend``), for a peer server or a raw loop, so both sides of a benchmark use
    one BLAS; None where mlxcel preloads nothing (a GPU, macOS)."""
    from mlxcel import backend

    blas = backend.find_fast_blas()
    go, _ = backend.preload_decision(
        platform=sys.platform, device=backend.mlx_device(), no_fast_blas=False,
        env=os.environ, blas_path=blas,
        mlx_links_blas=backend.links_blas(backend.elf_needed(backend.mlx_library()))
        if backend.mlx_library() else False)
    return backend.preload_env(os.environ, blas) if go and blas else None


def spawn_env(logdir: str | os.PathLike) -> dict[str, str]:
    """This environment with a ``sitecustomize`` making multiprocessing 'spawn': Granian may
    fork its worker after the parent initialised CUDA, which a spawned worker avoids."""
    site = pathlib.Path(logdir) / "spawn-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def server_exe() -> str:
    """The ``mlxcel-server`` console script of this interpreter's environment."""
    exe = pathlib.Path(sys.executable).parent / "mlxcel-server"
    return str(exe) if exe.exists() else shutil.which("mlxcel-server") or "mlxcel-server"


class MlxcelServer(Server):
    """The real ``mlxcel-server`` (its console script) with ``args`` on a free port of
    127.0.0.1, started and ready (``/health`` 200) when constructed; ``stop()`` ends its
    process group. Its log is in ``$TMPDIR``."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 timeout: float = 90, preexec_fn: Any = None) -> None:
        port = free_port()
        super().__init__("mlxcel", [server_exe(), "--port", str(port), *args], "/health",
                         pathlib.Path(os.environ.get("TMPDIR", "/tmp")), f"e2e-{port}",
                         env={**os.environ, **(env or {})}, bind=False, preexec_fn=preexec_fn)
        self.port, self.base = port, f"http://{HOST}:{port}"
        self.launch(timeout)


def health(base: str) -> dict[str, Any] | None:
    """mlxcel's /health JSON (engine counters), None if unavailable."""
    import httpx

    try:
        return httpx.get(base + "/health", timeout=5.0, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None


WORDS = (
    "Zebra",
    "Quartz",
    "Violet",
    "Jungle",
    "Xenon",
    "Kettle",
    "Yonder",
    "Marble",
    "Copper",
    "Lantern",
    "Harbor",
    "Meadow",
    "Falcon",
    "Ember",
    "Glacier",
    "Orchid",
)
BASE_PROMPT = (
    "Write a long story about a lighthouse keeper who finds a message in a "
    "bottle, and tell it slowly, with many details about the sea and the sky."
)


def bench_prompt(tag: str, i: int) -> str:
    """A prompt unique to (tag, i); the unique part comes first, so no two share a cached
    prefix longer than the chat template's."""
    return f"{WORDS[i % len(WORDS)]} {tag}-{i}. {BASE_PROMPT}"


# -- client -------------------------------------------------------------------------------
def _client_error(exc: Exception) -> tuple[str, str | None]:
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout", None
    if isinstance(exc, httpx.ConnectError):
        return "connect_refused", str(exc)[:200]
    if isinstance(exc, httpx.ReadTimeout):
        return "read_timeout", None
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return "dropped", f"{type(exc).__name__}: {exc}"[:200]
    return f"client_{type(exc).__name__}", str(exc)[:200]


async def _read_stream(r: Any, rec: dict[str, Any], times: list[float]) -> tuple[Any, bool]:
    usage = None
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        now = time.perf_counter()
        data = line[5:].strip()
        if data == "[DONE]":
            return usage, True
        chunk = json.loads(data)
        if chunk.get("error"):
            rec["error"], rec["detail"] = "stream_error", str(chunk["error"])[:300]
            return usage, False
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                times.append(now)
    return usage, False


async def stream_chat(client: Any, url: str, body: dict[str, Any], max_tokens: int) -> dict:
    """One streamed chat completion, timed at the client: TTFT, the gaps between content
    chunks, usage, and a failure name (HTTP status, refused / dropped connection, timeout,
    stream without [DONE], fewer than ``max_tokens`` tokens) rather than an exception, so a
    load level counts failures instead of stopping."""
    import httpx

    rec: dict[str, Any] = {
        "error": None,
        "completion_tokens": 0,
        "prompt_tokens": None,
        "cached_tokens": 0,
        "content_chunks": 0,
    }
    times: list[float] = []
    usage, done = None, False
    rec["t_send"] = t0 = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"http_{r.status_code}"
                rec["detail"] = (await r.aread())[:300].decode(errors="replace")
            else:
                usage, done = await _read_stream(r, rec, times)
    except (httpx.HTTPError, ValueError, OSError) as exc:
        rec["error"], detail = _client_error(exc)
        if detail:
            rec["detail"] = detail
    rec["t_end"] = time.perf_counter()
    _finish_record(rec, times, usage, t0)
    if rec["error"] is None and not done:
        rec["error"], rec["detail"] = "dropped", "stream ended without [DONE]"
    if rec["error"] is None and rec["completion_tokens"] < max_tokens:
        rec["error"] = "short"
        rec["detail"] = f"{rec['completion_tokens']} < {max_tokens} tokens"
    return rec


def _finish_record(rec: dict[str, Any], times: list[float], usage: Any, t0: float) -> None:
    rec["content_chunks"] = len(times)
    if usage:
        rec["completion_tokens"] = int(usage.get("completion_tokens") or 0)
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        rec["cached_tokens"] = int(details.get("cached_tokens") or 0)
    elif times:
        rec["completion_tokens"] = len(times)  # no usage chunk: count content chunks
    if not times:
        return
    rec["ttft_s"] = times[0] - t0
    rec["gaps_ms"] = [(b - a) * 1e3 for a, b in zip(times, times[1:], strict=False)]
    span, n = times[-1] - times[0], rec["completion_tokens"]
    if n > 1 and span > 0:
        rec["decode_tok_s"] = (n - 1) / span
        rec["tpot_ms"] = span * 1e3 / (n - 1)


# -- environment ---------------------------------------------------------------------------
def versions() -> dict[str, str]:
    out = {}
    for dist in ("mlx", "mlx-cuda-13", "mlx-cpu", "mlx-lm", "mlxcel", "httpx"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    out["python"] = platform.python_version()
    return out


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "platform": platform.platform(),
    }
    if shutil.which("nvidia-smi"):
        query = [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            run = subprocess.run(query, capture_output=True, text=True, timeout=20)
            info["gpu"] = run.stdout.strip()
    return info


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)

