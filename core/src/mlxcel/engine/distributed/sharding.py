"""Split a lazily loaded model over the world before its weights are read.

Tensor mode calls the model's own ``shard(group)`` (mlx-lm's: attention heads and MLP
columns split, two all-reduces per layer); pipeline mode calls mlx-lm's
``model.model.pipeline(group)`` (``PipelineMixin``: contiguous layers per rank, the last
rank holding the first layers and rank 0 the last ones). Only then are the parameters
evaluated, so each rank reads only its part of the checkpoint, as ``mlx_lm.utils.
sharded_load`` does. A model without the mode's method, or whose heads do not split over
the ranks, stops the start with one line naming what it supports.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import structlog

from mlxcel.engine.distributed.group import World
from mlxcel.errors import StartupError

log = structlog.get_logger("mlxcel.distributed")
MODES = ("tensor", "pipeline")
HEAD_KEYS = ("num_attention_heads", "num_key_value_heads")


def supported(model: Any) -> list[str]:
    """The modes the mlx-lm ``model`` supports."""
    inner = getattr(model, "model", None)
    modes = ["tensor"] if callable(getattr(model, "shard", None)) else []
    if callable(getattr(inner, "pipeline", None)):
        modes.append("pipeline")
    return modes


def check(model: Any, config: dict, mode: str) -> None:
    """Refuse a ``mode`` the model cannot run in (one line, before any collective)."""
    modes = supported(model)
    kind = config.get("model_type", type(model).__name__)
    if mode not in modes:
        have = f"it supports {' and '.join(modes)} only" if modes else "it supports neither " \
            "tensor nor pipeline mode"
        raise StartupError(f"--distributed {mode}: mlx-lm's {kind} model cannot run in "
                           f"{mode} mode; {have}")


def check_split(config: dict, mode: str, size: int) -> None:
    """Tensor mode splits every layer's heads: their counts must divide by the ranks."""
    if mode != "tensor":
        return
    for key in HEAD_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value % size:
            raise StartupError(f"--distributed tensor: {key} = {value} does not split over "
                               f"{size} ranks; use a world size that divides it, or "
                               "--distributed pipeline")


def apply(model: Any, config: dict, world: World) -> None:
    """Shard ``model`` (its parameters still lazy) for ``world.mode``, then read them."""
    check_split(config, world.mode, world.size)
    if world.mode == "tensor":
        model.shard(world.group)
    else:
        model.model.pipeline(world.group)
        log.info("distributed_layers", rank=world.rank, first=model.model.start_idx,
                 end=model.model.end_idx)
    mx.eval(model.parameters())
