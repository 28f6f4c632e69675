"""Constraint compiles in child processes: stoppable, memory-capped and off the GIL.

A grammar build runs in native code that cannot be interrupted and, for a hostile schema,
allocates without bound. So each build runs in a worker process (``python -m
mlxcel.engine.constraints.workers``) that caps its own address space (``RLIMIT_AS``), runs
at a lower priority (``os.nice``) and is killed at the timeout; a killed or crashed worker
is replaced on the next compile, so its slot is free at once. A worker receives the
vocabulary once, when it starts, then compiles one constraint per message and answers
with the serialized index (``backend.dump``) or the error's class and message.

Workers are started lazily, one per slot, and shared by the compilers of one backend
configuration and vocabulary in a process (``pool_for``): a server has one, and a test
suite does not start new processes for each compiler; beyond ``POOLS`` vocabularies the
least recently used pool's workers are stopped. Frames are pickles over two pipes
(``multiprocessing.connection``); nothing else is written on them.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

from mlxcel import errors
from mlxcel.engine.constraints.vocabulary import TokenVocabulary
from mlxcel.errors import ConstraintTooComplex, MlxcelError, Overloaded

STARTUP_TIMEOUT = 120.0  # seconds for a worker to import and take the vocabulary
NICE = 10  # how much lower than the server a worker's priority is


class Worker:
    """One child process and its two pipes."""

    def __init__(self, backend: Any, vocabulary: TokenVocabulary, memory_bytes: int) -> None:
        down_r, down_w = os.pipe()  # server -> worker
        up_r, up_w = os.pipe()  # worker -> server
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(down_r), str(up_w), str(memory_bytes)],
                pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL)
        finally:
            os.close(down_r)
            os.close(up_w)
        self._send = Connection(down_w, readable=False)
        self._recv = Connection(up_r, writable=False)
        try:
            self._send.send((backend, dict(vocabulary.tokens), vocabulary.eos_ids,
                             vocabulary.size, vocabulary.fingerprint, dict(vocabulary.added)))
            if not self._recv.poll(STARTUP_TIMEOUT) or self._recv.recv() != "ready":
                raise OSError("the constraint worker did not start")
        except (OSError, EOFError):
            self.kill()
            raise Overloaded("the grammar compiler could not start a worker; try again") \
                from None

    def compile(self, constraint: Any, timeout: float) -> bytes:
        """The serialized index, or the worker's error; ``ConstraintTooComplex`` when the
        build passes ``timeout`` or the memory cap (the worker is then dead)."""
        try:
            self._send.send(constraint)
            if not self._recv.poll(timeout):
                self.kill()
                raise ConstraintTooComplex(
                    f"{constraint.subject} did not compile within {timeout:g} s; a simpler "
                    "one compiles faster")
            answer = self._recv.recv()
            if answer[0] == "ok":
                return self._recv.recv_bytes()
        except (OSError, EOFError):
            self.kill()
            raise ConstraintTooComplex(f"{constraint.subject} needs more memory to compile "
                                       "than the server allows; a simpler one needs less") \
                from None
        _kind, name, message, param = answer
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, MlxcelError):
            raise cls(message, param=param)
        raise RuntimeError(f"the constraint worker failed: {name}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Stop the process now (SIGKILL: native code ignores anything gentler)."""
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for conn in (self._send, self._recv):
            conn.close()


class Pool:
    """``size`` slots, each a worker started on first use; at most ``queue`` compiles wait
    for a slot, and none longer than the compile timeout: past either, ``Overloaded``
    (the server is busy; the schema is not at fault)."""

    def __init__(self, backend: Any, vocabulary: TokenVocabulary, size: int,
                 memory_bytes: int, queue_size: int) -> None:
        self.backend, self.vocabulary, self.memory_bytes = backend, vocabulary, memory_bytes
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(size):
            self._idle.put(slot)
        self._workers: list[Worker | None] = [None] * size
        self._waiting = threading.BoundedSemaphore(size + queue_size)
        self.started = 0  # workers started, for tests
        self.closed = False  # set when evicted: each worker is stopped once it is idle

    def compile(self, constraint: Any, timeout: float) -> bytes:
        if not self._waiting.acquire(blocking=False):
            raise Overloaded("too many grammars are compiling; try again shortly",
                             code="grammar_queue_full")
        try:
            try:
                slot = self._idle.get(timeout=timeout)
            except queue.Empty:
                raise Overloaded("too many grammars are compiling; try again shortly",
                                 code="grammar_queue_full") from None
            try:
                return self._worker(slot).compile(constraint, timeout)
            finally:
                worker = self._workers[slot]
                if worker is not None and (self.closed or not worker.alive):
                    worker.kill()
                    self._workers[slot] = None
                self._idle.put(slot)
        finally:
            self._waiting.release()

    def _worker(self, slot: int) -> Worker:
        worker = self._workers[slot]
        if worker is None:
            worker = self._workers[slot] = Worker(self.backend, self.vocabulary,
                                                  self.memory_bytes)
            self.started += 1
        return worker

    def close(self) -> None:
        """Stop the idle workers now and each busy one when its compile ends."""
        self.closed = True
        idle = []
        while True:
            try:
                idle.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for slot in idle:
            worker = self._workers[slot]
            if worker is not None:
                worker.kill()
                self._workers[slot] = None
            self._idle.put(slot)


POOLS = 4  # pools kept per process (one per vocabulary): the oldest is closed beyond
_POOLS: OrderedDict[tuple, Pool] = OrderedDict()
_POOLS_LOCK = threading.Lock()


def pool_for(backend: Any, vocabulary: TokenVocabulary, *, size: int, memory_bytes: int,
             queue_size: int) -> Pool:
    """The process's pool for this backend configuration and vocabulary."""
    key = (type(backend), backend.cache_tag, vocabulary.fingerprint, size, memory_bytes,
           queue_size)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = Pool(backend, vocabulary, size, memory_bytes, queue_size)
            if len(_POOLS) > POOLS:
                _POOLS.popitem(last=False)[1].close()
        _POOLS.move_to_end(key)
        return pool


@atexit.register
def _close_pools() -> None:
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()


def _limit(memory_bytes: int) -> None:
    """Cap this process's address space and lower its priority; a platform that refuses
    either (``RLIMIT_AS`` on macOS) keeps the timeout as its bound."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
    try:  # glibc: each thread's malloc arena reserves address space
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass
    try:
        os.nice(NICE)
    except OSError:
        pass


def _serve(down: Connection, up: Connection) -> None:
    backend, tokens, eos_ids, size, fingerprint, added = down.recv()
    vocabulary = TokenVocabulary(tokens=tokens, eos_ids=eos_ids, size=size,
                                 fingerprint=fingerprint, added=added)
    up.send("ready")
    while True:
        try:
            constraint = down.recv()
        except EOFError:  # the server closed the pipe or exited
            return
        try:
            data = backend.dump(backend.compile(constraint, vocabulary))
        except MlxcelError as exc:
            up.send(("error", type(exc).__name__, exc.message, exc.param))
            continue
        except MemoryError:
            raise SystemExit(3) from None
        except Exception as exc:  # reported by class name: messages may quote the schema
            up.send(("error", type(exc).__name__, "", None))
            continue
        up.send(("ok",))
        up.send_bytes(data)


def main(argv: list[str]) -> None:
    down_fd, up_fd, memory_bytes = (int(a) for a in argv)
    _limit(memory_bytes)
    _serve(Connection(down_fd, writable=False), Connection(up_fd, readable=False))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (MemoryError, pickle.UnpicklingError, EOFError, KeyboardInterrupt):
        sys.exit(3)
