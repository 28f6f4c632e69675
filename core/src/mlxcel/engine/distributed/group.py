"""The distributed world of one server: MLX's own group, the host-side broadcast of
rank 0's messages, and the in-graph broadcast of its sampled tokens.

Every rank runs the same engine steps, so every collective is entered by every rank in
the same order; the rule that keeps it so is that rank 0 sends each message (``send``)
from the engine thread just before the steps it describes, and the followers receive it
(``receive``) before they run them. A message is a ``uint8`` buffer that only rank 0
fills, summed over the group (``mx.distributed.all_sum``): every rank then holds rank 0's
bytes, with no other transport than the one the model's own collectives use. A fixed
frame carries the length and the usual small message in one collective; a longer one
takes a second collective for the rest.
"""

from __future__ import annotations

import platform
import struct
from typing import Any

import mlx.core as mx
import numpy as np
import structlog

from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.distributed")
FRAME = 1024  # bytes of every message's first collective (length header included)
HEADER = struct.Struct("<I")
TEXT_BYTES = 128  # per rank, for the strings gathered once at start-up
BACKENDS = ("any", "ring", "jaccl", "nccl", "mpi")

_current: World | None = None


class World:
    """The group every rank of this server belongs to, and the mode it was split in."""

    def __init__(self, group: Any, mode: str, backend: str) -> None:
        self.group = group
        self.mode = mode
        self.backend = backend
        self.rank = group.rank()
        self.size = group.size()
        self.devices: list[str] = []  # every rank's device, gathered at start-up

    # -- rank 0's messages -----------------------------------------------------------
    def send(self, payload: bytes) -> None:
        """Rank 0: hand ``payload`` to every rank (``receive`` on theirs)."""
        framed = HEADER.pack(len(payload)) + payload
        head = framed[:FRAME].ljust(FRAME, b"\0")
        self._sum(head)
        if len(framed) > FRAME:
            self._sum(framed[FRAME:])

    def receive(self) -> bytes:
        """A follower: the next payload rank 0 sends."""
        head = self._sum(bytes(FRAME))
        (length,) = HEADER.unpack_from(head)
        body = head[HEADER.size:HEADER.size + length]
        rest = HEADER.size + length - FRAME
        if rest > 0:
            body += self._sum(bytes(rest))
        return body

    def _sum(self, data: bytes) -> bytes:
        mine = data if self.rank == 0 else bytes(len(data))
        out = mx.distributed.all_sum(mx.array(np.frombuffer(mine, np.uint8)),
                                     group=self.group)
        mx.eval(out)
        return np.asarray(out).tobytes()

    # -- in the graph ------------------------------------------------------------------
    def share_tokens(self, sampled: mx.array) -> mx.array:
        """Rank 0's sampled tokens on every rank, inside the step's graph (no host round
        trip): constraints, penalties and stops then only have to be exact on rank 0.
        A follower's zeros depend on its own sampled tokens, so the step's forward (and
        its collectives) is evaluated before this sum on every rank, in the same order."""
        mine = sampled if self.rank == 0 else mx.depends(mx.zeros_like(sampled), sampled)
        return mx.distributed.all_sum(mine, group=self.group)

    def gather_text(self, text: str) -> list[str]:
        """Every rank's ``text`` (at most ``TEXT_BYTES`` bytes of it), in rank order."""
        raw = text.encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
        out = mx.distributed.all_gather(mx.array(np.frombuffer(raw, np.uint8)),
                                        group=self.group)
        mx.eval(out)
        data = np.asarray(out).tobytes()
        return [data[i * TEXT_BYTES:(i + 1) * TEXT_BYTES].rstrip(b"\0").decode(errors="replace")
                for i in range(self.size)]

    def info(self) -> dict[str, Any]:
        """What /health and /props show about the world."""
        return {"mode": self.mode, "backend": self.backend, "world_size": self.size,
                "ranks": [{"rank": i, "device": d} for i, d in enumerate(self.devices)]}


def device_name() -> str:
    """This rank's device as /health shows it: MLX's device and the host it is on."""
    from mlxcel.backend import mlx_device

    return f"{mlx_device()}@{platform.node() or 'unknown-host'}"


def init(mode: str, backend: str) -> World:
    """Join the launcher's group (once per process) for ``mode``; a process that no
    launcher started, or a backend that cannot start, is a one-line StartupError."""
    global _current
    if _current is not None:
        return _current
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except Exception as exc:
        raise StartupError(
            f"--distributed {mode}: MLX could not start its {backend} backend ({exc}); run "
            "the server under mlx.launch or `mlxcel-server launch`") from None
    if group.size() < 2:
        raise StartupError(f"--distributed {mode}: this process is alone in its group; run "
                           "it under mlx.launch or `mlxcel-server launch` with 2+ ranks")
    _current = World(group, mode, backend)
    _current.devices = _current.gather_text(device_name())
    log.info("distributed_joined", rank=_current.rank, world_size=_current.size, mode=mode,
             backend=backend, devices=_current.devices)
    return _current


def current() -> World | None:
    """The world this process joined (None: it runs alone)."""
    return _current
