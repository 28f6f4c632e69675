"""The engine in a process of its own (``--engine-process``).

In one process, the engine thread's Python (building each step's graph, handing out tokens)
and the event loop's Python (one SSE chunk per token and stream) take turns on one GIL. At
64 streams on an H200 that stretched a decode step from ~9.7 to ~12.4 ms
(``bench/results/serving_gpu.md``). Here the server process keeps HTTP, templates and
tokenization, and a child process runs the unchanged ``EngineWorker`` on token ids.

Wire (``multiprocessing`` connection, pickled tuples):

* server -> engine: ``("submit", id, request)``, ``("cancel", id)``, ``("call", n, name)``
  (prompt-cache ``stats`` / ``reset``), ``("stop",)``.
* engine -> server: ``("ready", summary)`` or ``("failed", error)`` once, then
  ``("events", [(id, event), ...], status)`` -- one message per burst of events (a decode
  step's tokens), status being the slot/queue counters and ``EngineStats`` at that moment,
  so anything read after a finish event already counts it -- ``("reply", n, value)``.

``EngineProcess`` is the server-side stand-in for ``EngineWorker`` that ``EngineClient``
drives (submit through ``inbox.put``, ``cancel``, counters, ``prompt_cache``).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import sys
import threading
from typing import Any

import msgspec
import structlog

from mlxcel.backend import mlx_device
from mlxcel.engine.worker import EngineStats
from mlxcel.settings import Settings

log = structlog.get_logger("mlxcel.engine")

ENGINE_PROCESS_ENV = "MLXCEL_ENGINE_PROCESS"
CALL_TIMEOUT_S = 30.0


def use_process(mode: str) -> bool:
    """``--engine-process``: ``on``, ``off``, or ``auto`` = on when MLX computes on a GPU."""
    if mode == "auto":
        return mlx_device() == "gpu"
    return mode == "on"


class Summary(msgspec.Struct, kw_only=True):
    """What the server needs of the loaded checkpoint (everything but the weights)."""

    path: str
    family: Any  # mlxcel.families.api.Family
    config: dict
    defaults: Any  # mlxcel.engine.loader.GenerationDefaults
    context_length: int
    dtype: str
    device: str
    blas: str
    parallel: int
    memory_budget: int
    dtype_bytes: int


# -- server side ------------------------------------------------------------------------------
class _Inbox:
    def __init__(self, owner: EngineProcess) -> None:
        self._owner = owner

    def put(self, item: tuple[Any, Any]) -> None:
        self._owner.submit(*item)


class RemotePromptCache:
    """``PromptCache.stats()`` / ``reset()`` answered by the engine process."""

    def __init__(self, owner: EngineProcess) -> None:
        self._owner = owner

    def stats(self) -> dict[str, Any]:
        return self._owner.call("stats")

    def reset(self) -> dict[str, Any]:
        return self._owner.call("reset")


class EngineProcess:
    """Starts the engine process and stands in for its ``EngineWorker``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.parallel = max(1, settings.parallel)
        self.prefill_chunk = max(1, settings.prefill_chunk_size)
        self.state, self.error = "loading", None
        self.checkpoint: Any = None
        self.memory_budget = 0
        self.dtype_bytes = 2
        self.stats = EngineStats()
        self.ready = threading.Event()
        self.lost = threading.Event()  # the engine process ended while serving
        self.inbox = _Inbox(self)
        self.prompt_cache = RemotePromptCache(self)
        self._streams: dict[int, Any] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._calls: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._sent = 0  # submissions sent
        self._status = (0, 0, 0)  # engine's (queued, received, active)
        self._stopping = False
        self._conn: Any = None
        self._proc: Any = None

    # -- what EngineClient reads ----------------------------------------------------------
    @property
    def queued(self) -> int:
        queued, received, _ = self._status
        return queued + self._sent - received  # sent but not yet seen count as queued

    @property
    def active_count(self) -> int:
        return self._status[2]

    def count_queued(self, delta: int) -> None:
        """The engine counts its own queue (see ``queued``)."""

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=engine_main, args=(child, self.settings.to_env()),
                                 name="mlxcel-engine", daemon=True)
        self._proc.start()
        child.close()
        threading.Thread(target=self._read, name="mlxcel-engine-reader", daemon=True).start()

    def submit(self, req: Any, stream: Any) -> None:
        sid = next(self._ids)
        self._streams[sid] = stream
        stream.engine_id = sid
        self._sent += 1
        self._send(("submit", sid, req))

    def cancel(self, stream: Any) -> None:
        sid = getattr(stream, "engine_id", None)
        if sid is not None and sid in self._streams:
            self._send(("cancel", sid))

    def wake(self) -> None:
        """Nothing to wake: the engine process reads its own messages."""

    def call(self, name: str) -> Any:
        """Ask the engine process (prompt-cache ``stats`` / ``reset``) and wait for it."""
        n = next(self._ids)
        done, box = threading.Event(), []
        self._calls[n] = (done, box)
        try:
            self._send(("call", n, name))
            if not done.wait(CALL_TIMEOUT_S) or not box:
                raise RuntimeError(f"the engine process did not answer {name!r}")
            return box[0]
        finally:
            self._calls.pop(n, None)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        if self._proc is None:
            return
        try:
            self._send(("stop",))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    # -- internals ---------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "events":
                    self._deliver(message[1], message[2])
                elif kind == "reply":
                    waiter = self._calls.get(message[1])
                    if waiter is not None:
                        waiter[1].append(message[2])
                        waiter[0].set()
                elif kind == "ready":
                    self._ready(message[1])
                elif kind == "failed":
                    self.state, self.error = "failed", message[1]
                    self.ready.set()
        except (EOFError, OSError):
            pass
        self._gone()

    def _deliver(self, items: list[tuple[int, Any]], status: tuple) -> None:
        # counters first: a reader woken by a finish event then sees it counted
        queued, received, active, self.stats = status
        self._status = (queued, received, active)
        for sid, event in items:
            stream = self._streams.get(sid)
            if stream is None:
                continue
            if event.finish_reason is not None:
                del self._streams[sid]
            stream.emit(event)

    def _ready(self, summary: Summary) -> None:
        from pathlib import Path

        from mlxcel.chat_template import load_chat_template
        from mlxcel.engine.loader import LoadedCheckpoint
        from mlxcel.engine.tokenizer import Tokenizer

        try:  # the tokenizer and chat template are loaded again here (they do not pickle)
            path, defaults = Path(summary.path), summary.defaults
            tokenizer = Tokenizer.from_dir(path, set(defaults.eos_token_ids))
            template_file = self.settings.chat_template_file
            template = load_chat_template(
                path, tokenizer.config, override=Path(template_file) if template_file else None,
                bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
            self.checkpoint = LoadedCheckpoint(
                path=path, family=summary.family, model=None, config=summary.config,
                tokenizer=tokenizer,
                template=template, defaults=defaults, context_length=summary.context_length,
                dtype=summary.dtype, device=summary.device, blas=summary.blas)
            self.parallel = summary.parallel
            self.memory_budget, self.dtype_bytes = summary.memory_budget, summary.dtype_bytes
            self.state = "ready"
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
        self.ready.set()

    def _gone(self) -> None:
        """The engine process ended: fail whatever still waits on it."""
        code = self._proc.exitcode if self._proc is not None else None
        if not self._stopping:
            log.error("engine_process_exited", exitcode=code)
            if self.state != "failed":
                self.state, self.error = "failed", f"the engine process exited ({code})"
                self.lost.set()
        self.ready.set()
        from mlxcel.types import GenerationEvent

        for sid, stream in list(self._streams.items()):
            del self._streams[sid]
            stream.emit(GenerationEvent(finish_reason="error",
                                        error="server shutting down" if self._stopping
                                        else "the engine process exited"))
        for done, _ in list(self._calls.values()):
            done.set()


# -- engine side ------------------------------------------------------------------------------
class RemoteSink:
    """A sequence's sink in the engine process: events go out with the next flush."""

    def __init__(self, sid: int, outbox: Outbox, registry: dict[int, RemoteSink]) -> None:
        self.sid = sid
        self.outbox = outbox
        self.registry = registry  # live sinks by id (the cancel messages' lookup)
        self.cancelled = False

    def emit(self, event: Any) -> None:
        self.outbox.items.append((self.sid, event))
        if event.finish_reason is not None:
            self.registry.pop(self.sid, None)


class Outbox:
    """Events of one burst, sent as one message with the counters (``flush``)."""

    def __init__(self, conn: Any, worker: Any, lock: threading.Lock) -> None:
        self.conn, self.worker, self.lock = conn, worker, lock
        self.items: list[tuple[int, Any]] = []
        self.received = 0
        self._last: tuple | None = None

    def status(self) -> tuple:
        w = self.worker
        return (w.queued, self.received, w.active_count,
                msgspec.structs.replace(w.stats))

    def flush(self) -> None:
        status = self.status()
        if not self.items and status == self._last:
            return
        items, self.items = self.items, []
        self._last = status
        try:
            with self.lock:
                self.conn.send(("events", items, status))
        except (OSError, ValueError):  # the server is gone; the engine stops on its own
            pass


def engine_main(conn: Any, settings_json: str) -> None:
    """The engine process: load the model, run the worker, serve the connection."""
    os.environ["MLXCEL_SETTINGS_JSON"] = settings_json
    settings = Settings.from_env()
    from mlxcel.engine.loader import load_checkpoint
    from mlxcel.engine.prompt_cache import prompt_cache_from
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.logging import configure
    from mlxcel.plugins import load_plugins

    configure(settings.log_format)
    log.info("engine_process", pid=os.getpid())
    plugins = load_plugins(settings.plugins, settings.disable_plugins)
    worker = EngineWorker(
        lambda: load_checkpoint(settings.model, plugins.families, dtype=settings.dtype,
                                chat_template_file=settings.chat_template_file),
        settings.parallel, settings.prefill_chunk_size, prompt_cache_from(settings))
    lock = threading.Lock()
    outbox = Outbox(conn, worker, lock)
    worker.flush = outbox.flush
    worker.start()
    worker.ready.wait()
    with lock:
        if worker.state != "ready":
            conn.send(("failed", worker.error or "the model failed to load"))
        else:
            ck = worker.checkpoint
            conn.send(("ready", Summary(
                path=str(ck.path), family=ck.family, config=ck.config, defaults=ck.defaults,
                context_length=ck.context_length, dtype=ck.dtype, device=ck.device,
                blas=ck.blas, parallel=worker.parallel, memory_budget=worker.memory_budget,
                dtype_bytes=worker.dtype_bytes)))
    sinks: dict[int, RemoteSink] = {}
    try:
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "submit":
                sink = sinks[message[1]] = RemoteSink(message[1], outbox, sinks)
                outbox.received += 1
                worker.count_queued(1)
                worker.inbox.put((message[2], sink))
            elif kind == "cancel":
                sink = sinks.pop(message[1], None)
                if sink is not None:
                    sink.cancelled = True
                    worker.wake()
            elif kind == "call":
                cache = worker.prompt_cache
                value = cache.stats() if message[2] == "stats" else cache.reset()
                with lock:
                    conn.send(("reply", message[1], value))
            elif kind == "stop":
                break
    except (EOFError, OSError):
        pass
    worker.shutdown()
    with lock:
        try:
            conn.close()
        except OSError:
            pass
    # skip interpreter teardown: MLX's C++ threads abort it ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
