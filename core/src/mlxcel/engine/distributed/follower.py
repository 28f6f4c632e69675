"""A follower rank: no HTTP, one loop that replays rank 0's operations on its own engine.

The follower builds the same ``EngineWorker`` as rank 0 (same model, its own shard of it)
and never schedules: each ``Message`` it receives says what rank 0 ran, and it runs the
same methods on its own state, so every collective inside the model and the token
broadcast meet their peers. Its sequences carry only what the steps read (prompt, cache
hit, context) and emit into a null sink; rank 0's choices (which rows, which cache entry,
when a row finished) come in the messages, never from local sampling, clocks or memory.
Its prompt-cache entries are its own shards of rank 0's, keyed by rank 0's entry ids.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import mlx.core as mx
import msgspec
import structlog

from mlxcel.engine.cache.entries import Hit
from mlxcel.engine.distributed import liveness
from mlxcel.engine.distributed import messages as m
from mlxcel.engine.distributed.group import World
from mlxcel.engine.distributed.hooks import Alone
from mlxcel.engine.distributed.leader import PING_S
from mlxcel.engine.distributed.watchdog import Watchdog, exit_follower
from mlxcel.engine.sequence import Sequence
from mlxcel.errors import StartupError
from mlxcel.types import GenerationRequest, SamplingParams

log = structlog.get_logger("mlxcel.distributed")
REPLAY_SAMPLING = SamplingParams(temperature=0.0)  # never read: rank 0's tokens are used


class NullSink:
    cancelled = False

    def emit(self, event: Any) -> None: ...


class Shard(msgspec.Struct):
    """A follower's stand-in for rank 0's ``CacheEntry``: this rank's shard of it (rank 0
    takes no checkpoints in a distributed engine: a hit is an entry or a cut of one)."""

    payload: Any
    length: int = -1  # not known here: a hit cuts it (a cut to its own length is a no-op)


class Follower(Alone):
    """The hooks of a follower's ``EngineWorker`` (inert but ``agree``: rank 0 decides)
    and its loop."""

    active = True

    def __init__(self, worker: Any, world: World, timeout: float) -> None:
        self.worker = worker
        self.world = world
        self.seqs: dict[int, Sequence] = {}  # by rank 0's order, while any structure holds it
        self.entries: dict[int, Any] = {}  # rank 0's prompt-cache entry id -> this shard
        self.steps: deque[Any] = deque()  # decode steps queued, not read back
        self.stopped = False  # rank 0 asked this rank to stop
        self.watchdog = Watchdog(timeout + PING_S, exit_follower, "follower")

    # -- start-up ------------------------------------------------------------------------
    def agree(self, worker: Any) -> None:
        """Take rank 0's plan-shaping policy; a different path or slot count is fatal."""
        a = m.decode_agreement(self.world.receive())
        if (a.path, a.parallel) != (worker.path, worker.parallel):
            raise StartupError(f"rank {self.world.rank} batches on the {worker.path} path with "
                               f"{worker.parallel} slots, rank 0 on {a.path} with {a.parallel}")
        worker.policy = msgspec.structs.replace(
            worker.policy, warm_up=False, hold_groups=a.hold_groups,
            burst_chunks=a.burst_chunks, lazy_leave=a.lazy_leave, prefill_align=a.prefill_align)
        host = liveness.connect(list(a.hosts), a.port, a.token, self.world.rank, lambda: (
            self.stopped or exit_follower("rank 0 is gone (its process ended: the liveness "
                                          "connection closed)")))
        log.info("distributed_liveness", rank=self.world.rank, rank0=f"{host}:{a.port}")

    def share_tokens(self, sampled: Any) -> Any:
        return self.world.share_tokens(sampled)

    # -- the loop ------------------------------------------------------------------------
    def serve(self) -> int:
        """Apply rank 0's messages until it stops (0); an error ends the process (1)."""
        self.watchdog.start()
        log.info("distributed_follower_ready", rank=self.world.rank)
        while True:
            message = m.decode_message(self.world.receive())
            self.watchdog.beat()
            for op in message.ops:
                if isinstance(op, m.Stop):
                    self.stopped = True
                    self.watchdog.stop()
                    log.info("distributed_follower_stopped", rank=self.world.rank)
                    return 0
                self.apply(op)

    def apply(self, op: Any) -> None:
        """Run one of rank 0's operations on this rank's worker (``messages``)."""
        w = self.worker
        match op:
            case m.Admit(rows=rows):
                group = [self._sequence(r) for r in rows]
                w.prefilling = w._new_job(group)
            case m.PrefillStep(budget=budget, chunk=chunk):
                job = w.prefilling
                if job.step(budget, chunk):
                    w.prefilling = None
                    w.prefilled.append(job)
            case m.DropJob():
                w.prefilling = None
            case m.Join():
                w.prefilled = [j for j in w.prefilled if not all(s.finished for s in j.seqs)]
                w._join_prefilled()
            case m.Drop():
                w.batch.drop_finished()
            case m.Launch():
                step = w.batch.launch()
                step.start()
                self.steps.append(step)
            case m.ReadBack():
                self._read_back()
            case m.Finish(orders=orders):
                for order in orders:
                    self.seqs.pop(order).finished = True
            case m.Store(orders=orders, events=events):
                self._store(orders, events)
            case m.Clear():
                mx.clear_cache()

    def _sequence(self, row: m.Row) -> Sequence:
        req = GenerationRequest(request_id=f"rank0-{row.order}", prompt_tokens=row.prompt,
                                max_tokens=1 << 30, sampling=REPLAY_SAMPLING, ignore_eos=True)
        w = self.worker
        seq = Sequence(req, NullSink(), w.checkpoint.tokenizer, set(), row.order)
        if row.entry >= 0:
            seq.cache_hit = Hit(Shard(self.entries[row.entry]), row.hit)
            seq.cached = row.hit
        else:
            seq.cache_hit = ()
        self.seqs[row.order] = seq
        return seq

    def _read_back(self) -> None:
        step = self.steps.popleft()
        for seq, token in zip(step.rows, step.sampled.tolist(), strict=True):
            if not seq.finished:
                seq.generated += 1
                seq.context.append(token)

    def _store(self, orders: tuple[int, ...], events: tuple[tuple[int, ...], ...]) -> None:
        """Rank 0's prompt-cache changes: this rank's snapshot of each stored row, then
        every eviction, in rank 0's order."""
        snaps: list[Any] | None = None
        for event in events:
            if event[0] == 0:
                if snaps is None:
                    rows = [s for s in self.worker.batch.rows if s.order in set(orders)]
                    rows.sort(key=lambda s: orders.index(s.order))
                    snaps = self.worker.batch.snapshots(rows)
                entry, row, length = event[1:]
                tokens, payload = snaps[row]
                self.entries[entry] = payload.prefix(length) if length < len(tokens) \
                    else payload
            elif event[0] == 1:
                self.entries.pop(event[1], None)
            else:
                self.entries.clear()
