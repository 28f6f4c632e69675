"""Rank 0's side: the engine runs as on one device and tells the followers what it ran.

The worker calls one hook per operation that changes what the ranks hold (``admitted``,
``prefill``, ``joined``, ``dropped``, ``launch``, ``read_back``, ``stored``, ...). Each is
recorded in order; ``prefill`` and ``launch`` precede a collective step, so they send
everything recorded so far (one ``Message``) before the worker builds that step, and the
followers build the same step from the same state. Before each operation is recorded,
the sequences that finished since the last one (stop, length, error, client gone) are
recorded as a ``Finish``, and so are the prompt cache's evictions: finishes and cache
decisions are rank 0's alone, and followers take them at the same point of the order.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import structlog

from mlxcel.engine.distributed import liveness
from mlxcel.engine.distributed import messages as m
from mlxcel.engine.distributed.group import World
from mlxcel.engine.distributed.hooks import Alone
from mlxcel.engine.distributed.watchdog import Watchdog, abort

log = structlog.get_logger("mlxcel.distributed")
PING_S = 1.0  # an idle rank 0 sends an empty message this often (liveness, both ways)
FAILURE_HOLD_S = 3.0  # a failed distributed server keeps saying why on /health this long


class Leader(Alone):
    """The hooks of rank 0's ``EngineWorker`` (``worker.dist``)."""

    active = True
    failure_hold_s = FAILURE_HOLD_S

    def __init__(self, worker: Any, world: World, timeout: float) -> None:
        self.worker = worker
        self.world = world
        self.pending: list[Any] = []
        self.last_sent = time.monotonic()
        worker.prompt_cache.journal = []  # its evictions are followed by every rank
        self.watchdog = Watchdog(timeout, lambda why: self.fail(why), "leader")
        self.live = liveness.Listener()

    # -- start-up ------------------------------------------------------------------------
    def agree(self, worker: Any) -> None:
        """Send the plan-shaping policy, path and slots every rank must share."""
        worker.policy = msgspec.structs.replace(worker.policy, warm_up=False)
        p = worker.policy
        self.world.send(m.encode(m.Agreement(
            hold_groups=p.hold_groups, burst_chunks=p.burst_chunks, lazy_leave=p.lazy_leave,
            prefill_align=p.prefill_align, path=worker.path, parallel=worker.parallel,
            port=self.live.port, token=self.live.token,
            hosts=tuple(liveness.rank0_addresses()))))
        self.live.accept(self.world.size - 1, lambda rank: self.fail(
            f"rank {rank} is gone (its process ended: the liveness connection closed)"))
        self.watchdog.start()

    # -- the worker's hooks -------------------------------------------------------------
    def admitted(self, group: list[Any]) -> None:
        rows = []
        for s in group:
            hit = s.cache_hit or None
            rows.append(m.Row(s.order, tuple(s.req.prompt_tokens),
                              hit.entry.id if hit else -1, hit.n if hit else 0))
        self._record(m.Admit(tuple(rows)))

    def prefill(self, budget: int, chunk: int) -> None:
        self._record(m.PrefillStep(budget, chunk))
        self.flush()

    def dropped_job(self) -> None:
        self._record(m.DropJob())

    def joined(self) -> None:
        """Sent at once: the join samples the rows' first tokens, which every rank shares
        (``share_tokens``) before rank 0 reads them back."""
        self._record(m.Join())
        self.flush()

    def dropped(self) -> None:
        self._record(m.Drop())

    def launch(self) -> None:
        self._record(m.Launch())
        self.flush()

    def read_back(self) -> None:
        self._record(m.ReadBack())

    def stored(self, keep: list[Any]) -> None:
        self._finishes()
        events = self.worker.prompt_cache.drain_journal()
        self.pending.append(m.Store(tuple(s.order for s in keep), tuple(events)))

    def cleared(self) -> None:
        self._record(m.Clear())

    def end_iteration(self, busy: bool) -> None:
        """An idle rank 0 sends what is left at once, then a heartbeat every ``PING_S``:
        a follower that died is found while no request runs, and the followers know
        rank 0 lives."""
        if busy:
            return
        if self.pending or time.monotonic() - self.last_sent >= PING_S:
            self._record(None)
            self.flush()

    def stop(self) -> None:
        """The engine stops on request: followers end too (exit 0)."""
        self.watchdog.stop()
        self.live.stopping = True  # followers that end now end on request
        try:
            self._record(m.Stop())
            self.flush()
        except Exception as exc:  # a follower already gone: nothing to tell it
            log.warning("distributed_stop_unsent", error=f"{type(exc).__name__}: {exc}")
        self.live.close()

    def share_tokens(self, sampled: Any) -> Any:
        return self.world.share_tokens(sampled)

    def fatal(self, exc: BaseException) -> str:
        """The engine's error when a step failed with distributed work in flight."""
        peers = "rank 1" if self.world.size == 2 else f"one of ranks 1..{self.world.size - 1}"
        return (f"distributed {self.world.mode} over {self.world.size} ranks failed ("
                f"{peers} died or cannot be reached): {type(exc).__name__}: {exc}")

    def fail(self, why: str) -> None:
        abort(self.worker, f"distributed {self.world.mode} over {self.world.size} ranks: "
                           f"{why}")

    def info(self) -> dict[str, Any]:
        out = self.world.info()
        out["status"] = "failed" if self.worker.state == "failed" else "ok"
        if self.worker.state == "failed":
            out["error"] = self.worker.error
        return out

    # -- internals -----------------------------------------------------------------------
    def _record(self, op: Any) -> None:
        self._finishes()
        events = self.worker.prompt_cache.drain_journal()
        if events:
            self.pending.append(m.Store((), tuple(events)))
        if op is not None:
            self.pending.append(op)

    def _finishes(self) -> None:
        w = self.worker
        seqs = list(w.batch.rows) if w.batch is not None else []
        for job in [*w.prefilled, *([w.prefilling] if w.prefilling else [])]:
            seqs.extend(job.seqs)
        done = []
        for s in seqs:
            if s.finished and not getattr(s, "dist_told", False):
                s.dist_told = True
                done.append(s.order)
        if done:
            self.pending.append(m.Finish(tuple(done)))

    def flush(self) -> None:
        """Send the recorded operations as one message (the watchdog counts it alive)."""
        ops, self.pending = self.pending, []
        self.world.send(m.encode(m.Message(tuple(ops))))
        self.last_sent = time.monotonic()
        self.watchdog.beat()
