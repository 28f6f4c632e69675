"""Padded batch shapes: each batch's rows and width are rounded up to a small set of
buckets, so a server sees few distinct shapes however its requests mix.

Why: on a GPU a new input shape costs far more than its padding. MLX's CUDA attention
builds (and caches, in a bounded LRU) one cuDNN graph per (rows, width); matmul plans are
cached per shape too. Batches whose row count and width follow the mix of concurrent
requests would pay that on almost every forward. On the CPU a shape costs nothing and
every padded cell costs its compute, so there only the width is rounded, finely, and
rows are never added.

- Width: up to 64 tokens, a multiple of 16; above, a quarter octave (2^k .. 2^(k+1) in
  steps of 2^(k-2)), so padding adds under a quarter of the row, and the number of widths
  grows with the logarithm of the longest input. Never past the model's positions.
- Rows (GPU only): the next power of two. A launch-bound forward costs the same for 9
  rows as for 16.

Padding rows repeat the batch's first row (real tokens, so no row is fully masked) and
their results are dropped; padding columns carry the pad id under a zero mask, and each
row's pooling reads only its own tokens, so no result depends on the padding.
"""

from __future__ import annotations

import msgspec

WIDTH_STEP = 16  # the finest width step on a GPU
CPU_WIDTH_STEP = 8


class Shapes(msgspec.Struct, frozen=True, kw_only=True):
    """How a runner pads a batch: ``coarse`` widths (quarter octaves, for devices where
    each new shape compiles) or fine ones, and ``rows`` rounded to a power of two."""

    coarse: bool = True
    rows: bool = True

    @classmethod
    def for_device(cls, gpu: bool) -> Shapes:
        """The rule for where the model runs (see the module docstring)."""
        return cls(coarse=gpu, rows=gpu)

    def width(self, longest: int, cap: int) -> int:
        """The padded width of a batch whose longest row has ``longest`` tokens; never
        above ``cap`` (the model's positions) unless ``longest`` itself is."""
        if self.coarse:
            step = max(WIDTH_STEP, 1 << max(0, (longest - 1).bit_length() - 3))
        else:
            step = CPU_WIDTH_STEP
        padded = -(-max(longest, 1) // step) * step
        return max(longest, min(padded, cap))

    def row_count(self, n: int) -> int:
        """The padded row count of a batch of ``n`` inputs."""
        return 1 << (n - 1).bit_length() if self.rows and n > 1 else n


def on_gpu() -> bool:
    """Whether MLX's default device, on the calling (engine) thread, is a GPU."""
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.gpu
