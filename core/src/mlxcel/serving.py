"""The process shell around the app: the listen probe, the open-file limit, Granian's
HTTP/1.1 settings and shutdown, and the Granian worker's lifecycle (the app it builds, an
engine failure that stops the server, the heap freeze once the models have loaded)."""

from __future__ import annotations

import contextlib
import errno
import gc
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import time
from typing import Any

import structlog

from mlxcel.errors import StartupError
from mlxcel.settings import Settings, failure_file, hand_to_worker

log = structlog.get_logger("mlxcel.serving")
STREAM_FLUSH_S = 0.5  # how long open streams get to send their error frame before exit
FD_HEADROOM = 256  # descriptors beyond the connections: listen sockets, pipes, files, metrics
MLX_LM_HARD_NOFILE = 4096  # the hard limit mlx_lm.utils sets on import (it fails below it)


def check_listens(hosts: tuple[str, ...], port: int) -> str:
    """``check_listen`` for every address of ``--host a,b``: their IP addresses,
    comma-separated, each once (``localhost,127.0.0.1`` is one address)."""
    return ",".join(dict.fromkeys(check_listen(host, port) for host in hosts))


def check_listen(host: str, port: int) -> str:
    """Bind ``host:port`` once without SO_REUSEPORT, so that a port another server listens
    on is refused here: Granian binds with SO_REUSEPORT and would share it silently.
    Returns the IP address that bound, since Granian takes an address, not a name."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {host}: {exc.strerror}") from None
    errors: list[OSError] = []
    for family, type_, proto, _, addr in infos:  # "localhost" may name ::1 and 127.0.0.1
        with socket.socket(family, type_, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT: no conflict
            try:
                sock.bind(addr)
                sock.listen(1)
                return str(addr[0])
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StartupError(f"port {port} is in use") from None
                errors.append(exc)
    raise StartupError(f"cannot listen on {host}:{port}: {errors[0].strerror}")


def raise_fd_limit(max_connections: int, hard_before: int | None = None) -> int:
    """Raise the soft RLIMIT_NOFILE so that every permitted connection has a descriptor,
    and put back a hard limit a library lowered (``hard_before``) where that is allowed;
    a hard limit too low for --max-connections is logged, not fatal."""
    import resource

    inf = resource.RLIM_INFINITY
    needed = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want_hard = hard if hard_before is None else hard_before

    def soft_for(limit: int) -> int:
        if soft == inf:
            return limit
        return max(soft, needed) if limit == inf else min(max(soft, needed), limit)

    for target_hard in dict.fromkeys((want_hard, hard)):  # the second try: unprivileged
        target = (soft_for(target_hard), target_hard)
        if target == (soft, hard):
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, target)
            soft, hard = target
            break
        except (ValueError, OSError):
            continue
    if soft != inf and soft < needed:
        log.warning("fd_limit_low", soft=soft, hard=hard, needed=needed,
                    hint="lower --max-connections or raise the hard limit (ulimit -Hn)")
    return soft


def check_fd_hard_limit() -> None:
    """The hard RLIMIT_NOFILE must reach mlx-lm's, whose import sets it and fails when it
    cannot: raise it where allowed, else refuse to start with one line (not a traceback)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= MLX_LM_HARD_NOFILE:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, MLX_LM_HARD_NOFILE))
    except (ValueError, OSError):
        raise StartupError(f"the open-file hard limit is {hard}; mlx-lm needs at least "
                           f"{MLX_LM_HARD_NOFILE} (ulimit -Hn {MLX_LM_HARD_NOFILE})") from None


def worker_app() -> Any:
    """Granian's factory in the worker. mlx-lm's utils module sets RLIMIT_NOFILE to its own
    pair when imported, so it is imported first and the limit raised after it."""
    import resource

    from mlxcel.app import create_app
    from mlxcel.logging import configure

    settings = Settings.from_env()
    configure(settings.log_format, secrets=[settings.api_key, *settings.api_keys()])
    hard_before = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    import mlx_lm.utils  # noqa: F401  (check_fd_hard_limit made its setrlimit possible)

    raise_fd_limit(settings.max_connections, hard_before)
    app = create_app(settings, listening=True)
    engines = app.state["engines"]
    for thread in engines.threads:
        _exit_on_engine_failure(thread, failure_file())
    _freeze_heap_once_loaded(engines.threads)
    app.on_startup.append(lambda: on_end_streams(lambda: [
        thread.shutdown(timeout=0) for thread in engines.threads]))
    return app


def engine_failure(worker: Any) -> tuple[str, bool] | None:
    """Wait for an engine thread to end: (the fatal message, whether it had been serving)
    when it failed, else None (a requested shutdown)."""
    worker.ready.wait()
    loaded = worker.state == "ready"
    while worker.is_alive() and worker.state != "failed":  # a distributed failure
        worker.join(0.5)  # leaves the thread stuck in a collective: do not wait
    if worker.state != "failed":
        return None
    if loaded:
        return f"the engine stopped: {worker.error}", True
    return f"the model failed to load: {worker.error}", False


def _exit_on_engine_failure(worker: Any, failure_path: str | None) -> None:
    """In the Granian worker: an engine thread that fails (at load or later) stops the
    whole server, with the reason handed to the CLI (which prints it and exits non-zero)
    in the file ``failure_path``."""

    def watch() -> None:
        failure = engine_failure(worker)
        if failure is None:
            return
        message, was_serving = failure
        log.error("engine_failed", error=message)
        if was_serving:  # let open streams send their error frames (and /health say why)
            dist = getattr(worker, "dist", None)
            time.sleep(STREAM_FLUSH_S + getattr(dist, "failure_hold_s", 0.0))
        if failure_path:
            with open(failure_path, "w", encoding="utf-8") as fh:
                fh.write(message)
        os.kill(os.getppid(), signal.SIGTERM)  # Granian's main process shuts down
        os._exit(3)

    threading.Thread(target=watch, name="mlxcel-engine-watch", daemon=True).start()


def _freeze_heap_once_loaded(workers: list[Any]) -> None:
    """Once the models have loaded, collect and then freeze what the process holds
    (modules, models, tokenizers, templates): a full collection stops every thread, the
    engine's too, for as long as it walks the heap, and after the freeze it walks only what
    serving made since, not the whole startup heap each time."""

    def freeze() -> None:
        for worker in workers:
            worker.ready.wait()
        if all(worker.state == "ready" for worker in workers):
            gc.collect()
            gc.freeze()

    threading.Thread(target=freeze, name="mlxcel-gc-freeze", daemon=True).start()


END_STREAMS_SIGNAL = signal.SIGUSR1  # main -> worker: end the running requests now
STREAM_END_GRACE_S = 1.0  # before the drain limit: time for the streams' last frames


def _end_streams_before(drain_s: float) -> None:
    """Ask the worker to end its running requests ``STREAM_END_GRACE_S`` before Granian
    kills it at the drain limit, so a stream still running gets an error frame and
    ``[DONE]`` rather than a reset connection."""
    def signal_workers() -> None:
        for child in multiprocessing.active_children():
            with contextlib.suppress(OSError):
                os.kill(child.pid, END_STREAMS_SIGNAL)

    timer = threading.Timer(max(0.0, drain_s - min(STREAM_END_GRACE_S, drain_s / 2)),
                            signal_workers)
    timer.daemon = True
    timer.start()


def on_end_streams(callback: Any) -> None:
    """In the worker (its event loop running): ``callback()`` when the main process asks
    for the running requests to end (``_end_streams_before``)."""
    import asyncio

    asyncio.get_running_loop().add_signal_handler(END_STREAMS_SIGNAL, callback)


def _force_exit_on_second_signal(drain_s: float) -> None:
    """Granian's main process: the first SIGINT/SIGTERM starts its graceful shutdown (the
    worker ends what still runs just before ``drain_s``); a second one kills the worker and
    exits at once, as an operator who asks twice expects."""
    granian_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if seen:
            log.warning("shutdown_forced", signal=signal.Signals(signum).name)
            for child in multiprocessing.active_children():
                child.kill()
            os._exit(128 + signum)
        seen.append(signum)
        log.info("shutdown_started", signal=signal.Signals(signum).name)
        _end_streams_before(drain_s)
        previous = granian_handlers[signum]
        if callable(previous):
            previous(signum, frame)

    for sig in granian_handlers:
        signal.signal(sig, handler)


def granian_options(settings: Settings) -> dict[str, Any]:
    """HTTP/1.1 only, so the idle timeout also closes connections that never send a byte
    (the HTTP/2 sniffing of the auto mode waits for one); one permit per connection."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings

    return {
        "address": settings.hosts()[0], "port": settings.port, "interface": Interfaces.ASGI,
        "workers": 1, "factory": True, "log_access": False, "log_level": "warning",
        "http": HTTPModes.http1,
        "http1_settings": HTTP1Settings(header_read_timeout=int(settings.idle_timeout * 1000)),
        "backpressure": settings.max_connections,
        "runtime_threads": max(1, settings.threads_http),  # --threads-http; -1 = 1
        "workers_kill_timeout": settings.shutdown_timeout,
    }


def _relay_other_hosts(settings: Settings) -> None:
    """``--host a,b,...``: Granian listens on the first address; the others are bound
    here and relayed to it (``mlxcel.listeners``)."""
    first, *others = settings.hosts()
    if not others:
        return
    from mlxcel.listeners import bind, start_relays, target_of

    raise_fd_limit(settings.max_connections)  # two descriptors per relayed connection
    socks = [bind(host, settings.port, 1024) for host in others]
    start_relays(socks, (target_of(first), settings.port))
    log.info("listening", addresses=list(settings.hosts()), port=settings.port,
             relayed=others)


def serve(settings: Settings) -> int:
    """Run Granian (one worker) until it stops; a worker whose engine failed (at load or
    later) leaves its reason in a file, raised here as a StartupError. The worker exits
    right after asking Granian to stop, so Granian may see a crashed worker first and
    exit 1 itself (``SystemExit``): the reason in the file still decides."""
    from granian import Granian

    with tempfile.TemporaryDirectory(prefix="mlxcel-") as tmp:
        failure = os.path.join(tmp, "failure")
        hand_to_worker(settings, failure)
        _relay_other_hosts(settings)
        server = Granian("mlxcel.serving:worker_app", **granian_options(settings))
        server.on_startup(lambda: _force_exit_on_second_signal(settings.shutdown_timeout))
        try:
            server.serve()
        except SystemExit:
            if not os.path.exists(failure):
                raise
        if os.path.exists(failure):  # the worker could not load the model
            with open(failure, encoding="utf-8") as fh:
                raise StartupError(fh.read().strip())
    return 0
