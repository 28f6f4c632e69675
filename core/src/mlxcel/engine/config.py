"""What the engine takes from the server's settings, as a struct of its own: the engine
imports nothing from the process shell."""

from __future__ import annotations

from typing import Any

import msgspec


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine thread takes from the settings when it sets up; the defaults are
    the engine's own (nothing configured), so an engine built in-process needs none."""

    request_memory_budget: int | None = None  # bytes; can only lower the device's
    switch_interval: float | None = None  # None: CUDA_SWITCH_INTERVAL on CUDA, else Python's
    fuse_projections: bool | None = None  # None: on with CUDA only
    lean_decode: bool | None = None  # None: on with CUDA only
    decode_attention: str = "auto"  # mlxcel.engine.accel.attention.mode
    step_order: str = "auto"  # queue-first | emit-first | auto (EnginePolicy.emit_first)
    shared_positions: bool = True  # where the family and the model allow it
    engine_trace: str | None = None  # a JSONL file path (mlxcel.engine.trace)
    batch_size: int | None = None  # -b: caps a step's prefill tokens (the burst budget)
    distributed: str = "off"  # --distributed: off, tensor or pipeline
    distributed_timeout: float = 60.0  # seconds without a distributed step (watchdog)
    cache_checkpoint_interval: int = 256  # blocks of 16 tokens between prompt checkpoints
    vision_cache_size: int = 20  # items whose vision features stay cached (media_rows)
    # speculative decoding (mlxcel.engine.speculative): the drafter's session factory
    # ("module:attr", resolved by the shell from the plugins; None: no drafting), its kind,
    # and --prompt-lookup's mode (on: the batch governor stays out)
    drafter: Any = None  # the factory itself, or its "module:attr"
    drafter_kind: str = "prompt-lookup"
    prompt_lookup: str = "auto"
    draft_max: int = 16
    draft_min: int = 0
    draft_block_size: int = 0  # --draft-block-size: a block drafter's width (0: its own)
    model_draft: str | None = None  # -md: the draft-model drafter's checkpoint
    draft_force: bool = False  # serve a drafter that fails the startup exactness probe

    @classmethod
    def from_settings(cls, settings: Any) -> EngineConfig:
        """The fields of the same names from the server's settings (any object that has
        them), so the engine needs nothing of the shell's."""
        return cls(**{name: getattr(settings, name) for name in cls.__struct_fields__
                      if hasattr(settings, name)})
