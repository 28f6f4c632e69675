"""Compiling constraints off the engine thread, once per schema and tokenizer.

A compile can take seconds at a large vocabulary, and a hostile schema can make the native
build allocate without bound, so each build runs in a worker process (``workers``): capped
in memory (``CacheBudget.compile_bytes``), at a lower priority, off the server's GIL, and
killed at the timeout, which frees its slot at once. The caller gets a ``Future``: the
engine thread polls ``done()`` between steps, a request handler awaits
``asyncio.wrap_future``, a test calls ``result()``. It fails with ``ConstraintTooComplex``
when the build passes the timeout or the memory cap, and with ``Overloaded`` (503) when
every slot is busy and the queue is full or a slot did not free within the timeout.
Equal requests in flight share one compile.

Results are kept in memory and on disk under ``cache_dir`` (``mlxcel.engine.constraints.
store``), keyed by a hash of the backend's tag, the constraint's ``cache_text`` and the
vocabulary's fingerprint, so a restarted server does not compile again; each file holds its
own key, checked on read. Every constraint kind goes this one way, with the same timeout
and index-size bound. A GBNF grammar (``GrammarConstraint``) is not regular, so it goes to
the grammar backend (llguidance, made on the first grammar, so a server that never sees
one never imports it); every other kind goes to ``backend`` (outlines-core). Each backend
has its own cache directory and worker pool.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.engine.constraints.outlines import OutlinesBackend
from mlxcel.engine.constraints.protocol import Compiled, ConstraintBackend
from mlxcel.engine.constraints.store import DiskStore, MemoryStore, file_key, unpack
from mlxcel.engine.constraints.vocabulary import TokenVocabulary
from mlxcel.engine.constraints.workers import pool_for
from mlxcel.errors import CapabilityNotSupported, ConstraintTooComplex, MlxcelError
from mlxcel.types.constraints import Constraint, GrammarConstraint

DEFAULT_TIMEOUT = 60.0  # the options table's default for --grammar-compile-timeout


def default_cache_dir() -> Path:
    """Where compiled indexes persist when the caller names no directory."""
    return Path("~/.cache/mlxcel").expanduser() / "constraints"


@dataclass(frozen=True)
class CacheBudget:
    """Bytes of serialized index: kept in memory, kept on disk, and the most one schema
    may compile to (past it the request gets ``ConstraintTooComplex``); and the address
    space a compile worker process may take (``compile_bytes``)."""

    memory_bytes: int = 1 << 30
    disk_bytes: int = 2 << 30
    index_bytes: int = 512 << 20
    compile_bytes: int = 4 << 30


@dataclass
class CompileStats:
    """Counters for logs, metrics and tests."""

    compiled: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    timeouts: int = 0


class ConstraintCompiler:
    """Compiles constraints for one tokenizer (``vocabulary``: a ``TokenVocabulary``, or
    a callable that builds one, called once on a worker thread so that a slow or failing
    build never touches the engine thread; a failure is re-raised for each request)."""

    def __init__(self, vocabulary: TokenVocabulary | Callable[[], TokenVocabulary], *,
                 backend: ConstraintBackend | None = None,
                 grammar_backend: ConstraintBackend | None = None,
                 cache_dir: str | os.PathLike | None = None, timeout: float = DEFAULT_TIMEOUT,
                 budget: CacheBudget = CacheBudget(), workers: int = 2,
                 queue: int = 64) -> None:
        if not timeout > 0:
            raise ValueError("the compile timeout must be > 0")
        self.backend: ConstraintBackend = backend or OutlinesBackend()
        self._grammar_backend = grammar_backend
        self.timeout, self.budget, self.stats = timeout, budget, CompileStats()
        self._source = vocabulary
        self._vocabulary: TokenVocabulary | MlxcelError | None = \
            vocabulary if isinstance(vocabulary, TokenVocabulary) else None
        self._root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._disks: dict[str, DiskStore] = {}
        self._memory = MemoryStore(budget.memory_bytes)
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._workers, self._queue = workers, queue

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, eos_ids: set[int] | None = None,
                      **options: Any) -> ConstraintCompiler:
        """For an ``mlxcel.model.tokenizer.Tokenizer``; ``eos_ids``: the model's."""
        return cls(lambda: TokenVocabulary.from_tokenizer(tokenizer, eos_ids), **options)

    def check(self, constraint: Constraint) -> None:
        """The backend's cheap checks (limits, unsupported keywords), on the caller's
        thread: the request path refuses a bad schema before it queues anything."""
        self.backend_for(constraint).check(constraint)

    def backend_for(self, constraint: Constraint) -> ConstraintBackend:
        """The backend that compiles ``constraint``: the grammar backend for a GBNF
        grammar (501 when llguidance is not installed), else ``backend``."""
        if not isinstance(constraint, GrammarConstraint):
            return self.backend
        with self._lock:
            if self._grammar_backend is None:
                try:
                    from mlxcel.engine.constraints.llguidance import LLGuidanceBackend
                except ImportError:
                    raise CapabilityNotSupported(
                        "'grammar' needs the llguidance package, which is not installed",
                        param="grammar") from None
                self._grammar_backend = LLGuidanceBackend()
            return self._grammar_backend

    def _disk(self, backend: ConstraintBackend) -> DiskStore:
        """The backend's directory under the cache root, named by its tag."""
        tag = hashlib.sha256(backend.cache_tag.encode()).hexdigest()[:12]
        name = f"{backend.name}-{tag}"
        with self._lock:
            disk = self._disks.get(name)
            if disk is None:
                disk = self._disks[name] = DiskStore(self._root / name,
                                                     self.budget.disk_bytes)
            return disk

    def submit(self, constraint: Constraint) -> Future[Compiled]:
        """A future of the compiled constraint; checks raise here, before any thread."""
        self.check(constraint)
        key = constraint.cache_text
        out: Future[Compiled] = Future()
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self.stats.memory_hits += 1
                out.set_result(hit)
                return out
            job = self._inflight.get(key)
            if job is None:
                job = self._inflight[key] = Future()
                threading.Thread(target=self._run, args=(key, constraint, job),
                                 name="mlxcel-constraint-compile", daemon=True).start()
        self._chain(job, out, constraint.subject)
        return out

    def compile(self, constraint: Constraint) -> Compiled:
        """Blocking: the compiled constraint, or the error (``ConstraintTooComplex`` on
        timeout). Never call this on the engine thread."""
        return self.submit(constraint).result()

    def vocabulary(self) -> TokenVocabulary:
        """The vocabulary, built on first use; a build error is kept and raised again."""
        with self._lock:
            if self._vocabulary is None:
                try:
                    self._vocabulary = self._source()
                except MlxcelError as exc:
                    self._vocabulary = exc
            if isinstance(self._vocabulary, MlxcelError):
                raise type(self._vocabulary)(self._vocabulary.message)
            return self._vocabulary

    def _chain(self, job: Future, out: Future, subject: str) -> None:
        """``out`` follows ``job`` (whose worker enforces the timeout)."""

        def copy(done: Future) -> None:
            error = done.exception()
            _settle(out, error=error) if error is not None else _settle(out, result=done.result())

        job.add_done_callback(copy)

    def _run(self, key: str, constraint: Constraint, job: Future) -> None:
        try:
            compiled, size = self._load_or_build(key, constraint)
        except Exception as exc:  # the future carries every failure to its waiters
            with self._lock:
                self._inflight.pop(key, None)
            job.set_exception(exc)
            return
        with self._lock:
            self._inflight.pop(key, None)
            self._memory.put(key, compiled, size)
        job.set_result(compiled)

    def _load_or_build(self, key: str, constraint: Constraint) -> tuple[Compiled, int]:
        vocabulary = self.vocabulary()
        backend = self.backend_for(constraint)
        disk = self._disk(backend)
        name = hashlib.sha256(f"{key}\0{vocabulary.fingerprint}".encode()).hexdigest()[:40]
        header = file_key(backend.cache_tag, key, vocabulary.fingerprint)
        blob = disk.read(name)
        data = None if blob is None else unpack(blob, header)
        if data is not None and len(data) <= self.budget.index_bytes:
            try:
                compiled = backend.load(data, constraint, vocabulary)
            except Exception:  # unreadable: compile again and overwrite it
                pass
            else:
                with self._lock:
                    self.stats.disk_hits += 1
                return compiled, len(data)
        pool = pool_for(backend, vocabulary, size=self._workers,
                        memory_bytes=self.budget.compile_bytes, queue_size=self._queue)
        try:
            data = pool.compile(constraint, self.timeout)
        except ConstraintTooComplex:
            with self._lock:
                self.stats.timeouts += 1
            raise
        with self._lock:
            self.stats.compiled += 1
        if len(data) > self.budget.index_bytes:
            raise ConstraintTooComplex(
                f"{constraint.subject} compiles to more than {self.budget.index_bytes >> 20} "
                "MiB for this model's vocabulary; bound fewer string lengths or array sizes")
        compiled = backend.load(data, constraint, vocabulary)
        disk.write(name, header, data)
        return compiled, len(data)


def _settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> bool:
    """Complete ``future`` unless it already is (a timeout and a result may race)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # InvalidStateError: the other one came first
        return False
    return True
