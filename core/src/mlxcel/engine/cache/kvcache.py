"""The batched KV cache the engine decodes on: one per layer, rows left-padded to one index.

Two position modes:

* **absolute** (any model): every row's RoPE positions are its own token positions, so the
  model receives a per-row offset array (what mlx-lm's ``BatchKVCache`` does).
* **shared** (models whose RoPE is a pure rotation and whose attention reads
  ``cache.offset`` only as the RoPE offset): buffer slot ``j`` of every row has position
  ``j + base``, so all rows take one scalar offset. RoPE attention depends only on
  position *differences*, which this keeps within each row, so the output is the same.
  On MLX's CUDA backend the per-row offset array together with the padding mask falls onto
  a slow path at large batch (bench/results/cache_probe_gpu.md); a scalar offset avoids it.
  The price: keys are re-rotated when the frame of reference changes -- when a prefilled
  group joins the batch, when a row is copied out for the prompt cache (stored entries
  are always in the canonical frame, positions from 0), and when ``base`` drifts far
  from 0 (``REBASE_AT``), so positions stay as small as the context.

Without padding in any row, a one-token step needs no mask at all.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask

REBASE_AT = 4096  # shared mode: re-rotate the whole cache once |base| passes this


def _pure_rotations() -> tuple[type, ...]:
    """RoPE modules whose angle is linear in the position and that scale nothing."""
    from mlx_lm.models.rope_utils import Llama3RoPE, ProportionalRoPE

    return nn.RoPE, Llama3RoPE, ProportionalRoPE


def _rope_key(module: Any) -> tuple:
    freqs = getattr(module, "_freqs", None)
    return (type(module), getattr(module, "dims", None), getattr(module, "traditional", None),
            getattr(module, "base", None), getattr(module, "scale", None),
            None if freqs is None else tuple(freqs.tolist()))


def shared_position_rope(model: Any, family_allows: bool) -> Any | None:
    """The RoPE module to re-rotate keys with when ``model`` can decode in shared mode.

    None (absolute mode) unless ``family_allows`` (the family declares that its models read
    ``cache.offset`` only as the RoPE offset, and ``--shared-positions`` is on) and every
    rotary module in the model is a pure rotation of one configuration.
    """
    if not family_allows:
        return None
    module = getattr(model, "model", model)
    ropes = [m for _, m in module.named_modules() if "rope" in type(m).__name__.lower()]
    if not ropes or any(type(m) not in _pure_rotations() for m in ropes):
        return None
    if len({_rope_key(m) for m in ropes}) != 1:
        return None
    return ropes[0]


def rotate(rope: Any, keys: mx.array, delta: int | list[int] | mx.array) -> mx.array:
    """Keys [B, H, L, D] moved ``delta`` positions (one int, or one per row as a list or
    an int array [B]): each position is rotated as a length-1 sequence at offset
    ``delta``."""
    if isinstance(delta, mx.array):
        offset: int | mx.array = delta
    elif isinstance(delta, list):
        if not any(delta):
            return keys
        offset = mx.array(delta)
    elif delta == 0:
        return keys
    else:
        offset = delta
    b, h, n, d = keys.shape
    return rope(keys.reshape(b, h * n, 1, d), offset=offset).reshape(b, h, n, d)


def rotate_layers(rope: Any, keys: mx.array, delta: int | list[int]) -> mx.array:
    """Layer-stacked keys [layers, B, H, L, D] moved ``delta`` positions (one int, or one
    per row, the same in every layer): one rotation for all layers."""
    layers, b, h, n, d = keys.shape
    per_row = delta * layers if isinstance(delta, list) else delta
    return rotate(rope, keys.reshape(layers * b, h, n, d), per_row).reshape(keys.shape)


class KVRows:
    """One row's keys and values for all layers stacked ([layers, 1, H, n, D]; iterating one
    gives the layers), in the canonical frame: what the prompt cache keeps of a row of this
    path (``DecodeBatch.snapshots``)."""

    def __init__(self, keys: mx.array, values: mx.array) -> None:
        self.keys, self.values = keys, values

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes) + int(self.values.nbytes)

    def prefix(self, n: int) -> KVRows:
        return KVRows(self.keys[..., :n, :], self.values[..., :n, :])


@functools.lru_cache(maxsize=4)
def _rollback_index(size: int, extra: tuple[int, ...]) -> tuple[mx.array, mx.array]:
    """A ragged rollback's gather index [B, 1, size, 1] (slot t of row r reads slot
    t - extra[r]) and its per-row shift [B]: the same for every layer of a verify step,
    so built once per step rather than once per layer."""
    shift = mx.array(list(extra))
    src = mx.maximum(mx.arange(size)[None, :] - shift[:, None], 0)
    return src[:, None, :, None], shift


def _left_pad(x: mx.array, n: int) -> mx.array:
    """``x`` with ``n`` zero slots before its tokens (the second-to-last axis)."""
    if not n:
        return x
    widths = [(0, 0)] * x.ndim
    widths[-2] = (n, 0)
    return mx.pad(x, widths)


class BatchCache:
    """One layer's keys/values for a batch of rows; see the module docstring."""

    step = 256

    def __init__(self, pads: list[int], rope: Any | None = None) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.pads = list(pads)  # per row: leading slots that hold no token
        self._padded = any(self.pads)  # read every step (make_mask): kept with ``pads``
        self.rope = rope  # None: absolute positions
        self.base = 0  # shared mode: position of slot 0
        self._idx = 0  # next slot to write (the same for every row)
        self.reserve = 0  # slots the next allocation takes when they suffice (a prefill job)
        self._pad_array: mx.array | None = None
        self._offsets: tuple[int, mx.array] | None = None

    @classmethod
    def from_prefixes(cls, parts: list[tuple[mx.array, mx.array] | None], pads: list[int],
                      start: int, rope: Any | None) -> list[BatchCache]:
        """One cache per layer, in which row r holds ``parts[r]`` (canonical keys and
        values of every layer, [layers, 1, H, n, D] as ``KVRows`` holds them, of which the
        first ``n = start - pads[r]`` tokens are taken; None when n is 0) in slots
        ``pads[r]..start``.

        The rows are padded and joined once per side with every layer stacked, and
        re-rotated in one call: a group of prompt-cache hits then costs a graph of rows +
        layers ops, not rows x layers (the prefill of a wave of agent turns waits for it).
        Each layer's cache is a view of the stacked arrays, and a lone unpadded row's are
        views of its entry's: the first token written grows each layer into a buffer of
        its own (``update_and_fetch``), the one copy its prefix needs."""
        ref_k, ref_v = next(p for p in parts if p is not None)
        layers, _, h, _, dk = ref_k.shape
        dv = ref_v.shape[-1]
        keys, values = [], []
        for part, pad in zip(parts, pads, strict=True):
            if part is None:
                keys.append(mx.zeros((layers, 1, h, start, dk), ref_k.dtype))
                values.append(mx.zeros((layers, 1, h, start, dv), ref_v.dtype))
            else:
                n = start - pad
                keys.append(_left_pad(part[0][..., :n, :], pad))
                values.append(_left_pad(part[1][..., :n, :], pad))
        if len(keys) == 1:
            stacked_k, stacked_v = keys[0], values[0]
        else:
            stacked_k, stacked_v = mx.concatenate(keys, axis=1), mx.concatenate(values, axis=1)
        if rope is not None:  # canonical position i -> slot pads[r] + i, every layer
            stacked_k = rotate_layers(rope, stacked_k, list(pads))
        out = []
        for layer in range(layers):
            cache = cls(pads, rope)
            # a slice is a view; an integer index would copy the layer
            cache.keys = stacked_k[layer:layer + 1].squeeze(0)
            cache.values = stacked_v[layer:layer + 1].squeeze(0)
            cache._idx = start
            out.append(cache)
        return out

    # -- what the model calls ---------------------------------------------------------------
    @property
    def offset(self) -> int | mx.array:
        """RoPE offset of the next token: one int (shared) or one per row (absolute)."""
        if self.rope is not None:
            return self._idx + self.base
        if self._offsets is None or self._offsets[0] != self._idx:
            self._offsets = (self._idx, mx.array([self._idx - p for p in self.pads]))
        return self._offsets[1]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys.shape[2]:
            if prev + n <= self.reserve:
                grow = self.reserve - prev  # exactly what is known to come
            else:
                grow = (self.step + n - 1) // self.step * self.step
            self.reserve = 0
            b, h, _, dk = keys.shape
            new_k = mx.zeros((b, h, grow, dk), keys.dtype)
            new_v = mx.zeros((b, h, grow, values.shape[3]), values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :prev, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], new_v], axis=2)
        self._idx += n
        self.keys[..., prev:self._idx, :] = keys
        self.values[..., prev:self._idx, :] = values
        return self.keys[..., :self._idx, :], self.values[..., :self._idx, :]

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None,
                  **_: Any) -> mx.array | None:
        padded = self._padded
        if N == 1 and not padded and window_size is None:
            return None  # one query over all of its own keys: nothing to hide
        return create_causal_mask(N, offset=self._idx, window_size=window_size,
                                  left_padding=self.pad_array() if padded else None)

    def pad_array(self) -> mx.array:
        """Per row, the first slot that holds a token (int32 [B])."""
        if self._pad_array is None:
            self._pad_array = mx.array(self.pads, dtype=mx.int32)
        return self._pad_array

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys, self.values]

    # -- what the engine calls --------------------------------------------------------------
    def _set_pads(self, pads: list[int]) -> None:
        self.pads, self._pad_array, self._offsets = pads, None, None
        self._padded = any(pads)

    def trim(self) -> None:
        """Drop the leading slots that hold no token in any row. A batch whose rows all
        start at slot 0 needs no mask for a one-token step (``make_mask``): a lone row
        whose prefill columns were aligned (``PrefillJob``'s ``align``) then decodes
        with MLX's unmasked attention, like an unpadded cache."""
        trim = min(self.pads, default=0)
        if not trim:
            return
        if self.keys is not None:
            self.keys = self.keys[..., trim:, :]
            self.values = self.values[..., trim:, :]
        self._idx -= trim
        if self.rope is not None:
            self.base += trim
        self._set_pads([p - trim for p in self.pads])

    def rollback(self, drops: list[int]) -> None:
        """Forget the last ``drops[r]`` tokens of each row r (a verify step's rejected
        drafts). What every row drops moves the write index back; a row that drops more
        is moved right by the difference into padding of its own, so that every row
        still ends at the write index. Absolute mode: its offset (write index - padding)
        is then its own token count again. Shared mode: its keys are re-rotated to their
        new slots' positions."""
        common = min(drops, default=0)
        self._idx -= common
        extra = [d - common for d in drops]
        if not any(extra) or self.keys is None:
            return
        # one gather for the whole batch (slot t of row r reads slot t - extra[r]), not one
        # copy per row: a per-row slice update that reads its own buffer cannot be done in
        # place, so each would copy every row. The gather covers the whole buffer and
        # becomes it (its slots past the write index hold nothing anyone reads), so no
        # copy back into the old buffer follows: each layer's rollback is two gathers and,
        # in shared mode, one rotation, queued on the device per layer of every ragged step
        src, shift = _rollback_index(self.keys.shape[2], tuple(extra))
        self.keys = mx.take_along_axis(self.keys, src, axis=2)
        self.values = mx.take_along_axis(self.values, src, axis=2)
        if self.rope is not None:
            self.keys = rotate(self.rope, self.keys, shift)
        self._set_pads([p + e for p, e in zip(self.pads, extra, strict=True)])

    def filter(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (in that order); drop padding every remaining row has."""
        if self.keys is not None:
            index = mx.array(keep)
            self.keys, self.values = self.keys[index], self.values[index]
        self._set_pads([self.pads[i] for i in keep])
        self.trim()
        if self.rope is not None and abs(self.base) > REBASE_AT and self.keys is not None:
            self.keys = rotate(self.rope, self.keys[..., :self._idx, :], -self.base)
            self.values = self.values[..., :self._idx, :]
            self.base = 0

    def extend(self, *others: BatchCache, keep: list[int] | None = None) -> None:
        """Append ``others``' rows (in order), right-aligned at the longest write index;
        ``keep``: only these of our rows stay (rows that left without a copy of their own,
        see ``DecodeBatch.lazy_leave``). Padding every row then has is trimmed.

        Shared mode: each part's keys are re-rotated so that its next position equals ours.
        Every part is written into one new buffer that already has room for the next
        ``step`` tokens: one allocation and one copy per side however many groups join
        (padding, concatenating and then growing would copy the whole batch three times,
        and once more per group).
        """
        mine = self.pads if keep is None else [self.pads[i] for i in keep]
        parts = [(self, mine), *((o, o.pads) for o in others)]
        target = max(p._idx for p, _ in parts)
        pads = [q + target - p._idx for p, ps in parts for q in ps]
        trim = min(pads)
        width = target - trim
        like = next((p for p, _ in parts if p.keys is not None), None)
        if like is not None:
            _, h, _, dk = like.keys.shape
            keys = mx.zeros((len(pads), h, width + self.step, dk), like.keys.dtype)
            values = mx.zeros((len(pads), h, width + self.step, like.values.shape[3]),
                              like.values.dtype)
            first = 0
            for part, ps in parts:
                end = first + len(ps)
                if part.keys is not None and ps:
                    part_keys, part_values = part.keys, part.values
                    if part is self and keep is not None:
                        index = mx.array(keep)  # from the whole (contiguous) buffer
                        part_keys, part_values = part_keys[index], part_values[index]
                    lo = max(0, trim - (target - part._idx))  # slots every row pads
                    part_keys = part_keys[..., lo:part._idx, :]
                    if self.rope is not None and part is not self:
                        part_keys = rotate(self.rope, part_keys, self.offset - part.offset)
                    at = target - part._idx + lo - trim
                    keys[first:end, :, at:width, :] = part_keys
                    values[first:end, :, at:width, :] = part_values[..., lo:part._idx, :]
                first = end
            self.keys, self.values = keys, values
        if self.rope is not None:
            self.base += self._idx - width
        self._set_pads([q - trim for q in pads])
        self._idx = width

    def row(self, i: int, length: int) -> tuple[mx.array, mx.array]:
        """Row ``i``'s first ``length`` tokens in the canonical frame (positions from 0), as
        views (of the cache or of a temporary): the caller copies what it keeps."""
        p = self.pads[i]
        keys = self.keys[i:i + 1, :, p:p + length]
        values = self.values[i:i + 1, :, p:p + length]
        if self.rope is not None:
            keys = rotate(self.rope, keys, -(p + self.base))
        return keys, values


def stored_rows(caches: list[BatchCache], idx: list[int], lengths: list[int]) -> list[KVRows]:
    """Rows ``idx`` of every layer (row ``idx[j]``'s first ``lengths[j]`` tokens), each
    copied into arrays of its own in the canonical frame: what the prompt cache keeps.

    Every layer's cache has the same rows, padding and ``base`` (the batch changes them
    together), so the rows are gathered once per layer and side, stacked across layers and
    re-rotated in one call; a row is then one copy per side. Per-row, per-layer slices would
    cost a graph of rows x layers ops, which the engine thread builds and encodes while the
    rows' clients wait to send their next turn."""
    first = caches[0]
    if len(idx) == 1:
        i, n = idx[0], lengths[0]
        p = first.pads[i]
        keys = mx.stack([c.keys[i:i + 1, :, p:p + n] for c in caches])
        values = mx.stack([c.values[i:i + 1, :, p:p + n] for c in caches])
        if first.rope is not None:
            keys = rotate_layers(first.rope, keys, -(p + first.base))
        return [KVRows(keys, values)]
    take = mx.array(idx)
    hi = max(first.pads[i] + n for i, n in zip(idx, lengths, strict=True))
    # gather from the whole (contiguous) buffer: a slice of it first would be copied whole
    # before the gather
    keys = mx.stack([c.keys[take][..., :hi, :] for c in caches])  # [layers, rows, H, hi, D]
    values = mx.stack([c.values[take][..., :hi, :] for c in caches])
    if first.rope is not None:
        keys = rotate_layers(first.rope, keys, [-(first.pads[i] + first.base) for i in idx])
    out = []
    for j, (i, n) in enumerate(zip(idx, lengths, strict=True)):
        p = first.pads[i]
        out.append(KVRows(mx.contiguous(keys[:, j:j + 1, :, p:p + n]),
                          mx.contiguous(values[:, j:j + 1, :, p:p + n])))
    return out
