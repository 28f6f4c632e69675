"""Serving one model across several devices on ``mx.distributed`` (``--distributed``).

Rank 0 runs the whole server: HTTP, the scheduler and its ``EngineWorker``; every other
rank runs a follower (``follower``) with no HTTP. All ranks execute the same engine steps:
rank 0's worker records what it does (``leader``) and broadcasts it before each collective
step (``group``, ``messages``); followers replay it on their own state. Sampled tokens are
rank 0's on every rank inside the step's graph (``World.share_tokens``). A rank that dies
or hangs fails the server in bounded time (``watchdog``). docs/explanation/distributed.md
has the design and its rules; docs/howto/distributed.md how to run it.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.distributed.hooks import Alone


def load_shard(loaded: Any, config: dict, mode: str, backend: str) -> None:
    """Join the world and shard the lazily loaded checkpoint model for ``mode``."""
    from mlxcel.engine.distributed import group, sharding

    model = getattr(loaded, "model", loaded)
    sharding.check(model, config, mode)
    world = group.init(mode, backend)
    sharding.apply(model, config, world)


def attach(worker: Any) -> Any:
    """The worker's hooks (``worker.dist``): rank 0's ``Leader``, a ``Follower``, or
    ``Alone`` when this process runs alone."""
    from mlxcel.engine.distributed import group

    world = group.current()
    if world is None:
        return Alone()
    timeout = worker.config.distributed_timeout
    if world.rank == 0:
        from mlxcel.engine.distributed.leader import Leader

        return Leader(worker, world, timeout)
    from mlxcel.engine.distributed.follower import Follower

    return Follower(worker, world, timeout)
