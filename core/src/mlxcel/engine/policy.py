"""The engine's device choices, resolved once from the device and the options.

Each choice makes one backend faster and would only cost elsewhere, so Metal keeps MLX's
defaults and CUDA- or CPU-only tuning stays here. ``resolve_policy`` reads the device and
the ``EngineConfig`` once, at the engine's start; the worker is given the result and never
asks the device again, and a test builds the ``EnginePolicy`` it needs instead of setting
flags on a worker.
"""

from __future__ import annotations

import msgspec

from mlxcel.backend import CUDA_SWITCH_INTERVAL, mlx_device, on_cuda
from mlxcel.engine.config import EngineConfig

BURST_CHUNKS = 8  # CUDA: a burst's prefill group may take this many chunks' tokens per step
CUDA_VERIFY_STAGES = 4  # CUDA: a verify forward's parts queued while it is built


class EnginePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The defaults are the neutral choices (Metal's).

    ``hold_groups``: prefilled groups wait to join the batch together (CUDA: every join
    copies the batch and runs new shapes, ``scheduler.hold_group``).
    ``burst_chunks``: prefill tokens per step, in chunks, that a burst's group may take
    (``scheduler.budget``).
    ``lazy_leave``: finished rows stay in the batch until they are the majority or a group
    joins (``DecodeBatch``; CUDA, where dropping a row copies every other row).
    ``emit_first``: step n's tokens go out before step n+1 is queued (CUDA, where queuing
    encodes kernels with the GIL released; ``EngineWorker._decode_step``; ``--step-order``
    overrides it).
    ``prefill_align``: prefill columns are a multiple of this (CUDA's plan caches,
    ``batch.prefill_align``).
    ``warm_up``: every prefill chunk shape and batch operation runs once, what a lone
    request meets before the engine is ready and the rest between served steps (CUDA's
    plans and JIT; ``mlxcel.engine.accel.warmup``).
    ``fuse_projections``: q/k/v and gate/up matmuls fused (``mlxcel.engine.accel.fused_proj``).
    ``lean_decode``: decode steps of the layouts ``mlxcel.engine.accel.lean_decode`` knows
    run on [B, D] activations (CUDA, where every graph node of a step costs host time).
    ``bind_modules``: the model's submodules become plain instance attributes, so building
    a step's graph skips ``Module.__getattr__`` (CUDA, where the host builds each step while
    the device waits; ``mlxcel.engine.accel.module_attrs``).
    ``decode_attention``: the masked-attention path (``mlxcel.engine.accel.attention.mode``).
    ``limit_blas_threads``: small prefill matmuls run OpenBLAS on one thread (MLX's CPU
    device; ``mlxcel.engine.accel.cpu_blas``).
    ``switch_interval``: ``sys.setswitchinterval`` for the process, or None to keep it.
    ``verify_stages``: a speculative verify forward is queued to the device in this many
    parts while its graph is built (CUDA, where the device otherwise idles while the host
    builds it; ``mlxcel.engine.accel.staged``); 1 queues it whole.
    ``media_together``: the new images of a prefill group of media rows go through the
    vision tower in one call (the decoder's ``media_features``; CUDA, where each call
    syncs and launches per layer; on the CPU one call over many images is slower than
    one per image).
    """

    hold_groups: bool = False
    burst_chunks: int = 1
    lazy_leave: bool = False
    emit_first: bool = False
    prefill_align: int = 1
    warm_up: bool = False
    fuse_projections: bool = False
    lean_decode: bool = False
    bind_modules: bool = False
    decode_attention: str = "fused"
    limit_blas_threads: bool = False
    switch_interval: float | None = None
    verify_stages: int = 1
    media_together: bool = False


def resolve_policy(config: EngineConfig) -> EnginePolicy:
    """The policy for this process's MLX device, the options' overrides applied."""
    from mlxcel.engine.accel import attention
    from mlxcel.engine.batch import prefill_align

    cuda = on_cuda()
    interval = config.switch_interval
    if interval is None and cuda:
        interval = CUDA_SWITCH_INTERVAL
    return EnginePolicy(
        hold_groups=cuda, burst_chunks=BURST_CHUNKS if cuda else 1, lazy_leave=cuda,
        emit_first=cuda if config.step_order == "auto" else config.step_order == "emit-first",
        prefill_align=prefill_align(), warm_up=cuda,
        fuse_projections=cuda if config.fuse_projections is None else config.fuse_projections,
        lean_decode=cuda if config.lean_decode is None else config.lean_decode,
        bind_modules=cuda,
        decode_attention=attention.mode(config.decode_attention),
        limit_blas_threads=mlx_device() == "cpu", switch_interval=interval,
        verify_stages=CUDA_VERIFY_STAGES if cuda else 1, media_together=cuda)
