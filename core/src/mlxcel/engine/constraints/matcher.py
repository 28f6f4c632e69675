"""What every shipped ``Matcher`` shares around its backend: the EOS gate and the mask
row's edges (``protocol`` states the rules).

A matcher made inactive allows every token and stays put; EOS is allowed only where the
constraint may end, and once accepted the row is finished (only EOS again) until a
rollback takes it back. The backend supplies the rest: its live mask, consuming a token
and taking tokens back. Keeping the gate here keeps the backends' EOS rules identical.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def set_tokens(mask: np.ndarray, tokens: tuple[int, ...]) -> None:
    """Set the bits of ``tokens`` in a mask row."""
    bits = mask.view(np.uint32)
    for t in tokens:
        bits[t // 32] |= np.uint32(1 << (t % 32))


def eos_mask(words: int, eos_ids: tuple[int, ...]) -> np.ndarray:
    """A mask row of ``words`` words that allows only ``eos_ids``."""
    mask = np.zeros(words, np.int32)
    set_tokens(mask, eos_ids)
    return mask


class GatedMatcher:
    """The EOS gate over a backend's matcher. ``compiled`` has ``words`` (the mask row's
    width in use) and ``eos_ids``; a subclass implements ``accepting``,
    ``_write_live_mask``, ``_consume`` and ``_take_back``."""

    contiguous_rows = False  # True: the live mask is written through the row's pointer

    def __init__(self, compiled: Any, active: bool) -> None:
        self._compiled = compiled
        self._active = active
        self._finished = False

    @property
    def active(self) -> bool:
        return self._active

    @property
    def accepting(self) -> bool:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        return self._finished

    def start(self) -> None:
        self._active = True

    def write_mask_into(self, row: np.ndarray) -> None:
        words = self._compiled.words
        layout = "C-contiguous " if self.contiguous_rows else ""
        if row.dtype != np.int32 or row.ndim != 1 or row.size < words \
                or (self.contiguous_rows and not row.flags["C_CONTIGUOUS"]):
            raise ValueError(f"a mask row is {layout}int32 of at least {words} words")
        if not self._active:
            row[:] = -1
            return
        if self._finished:
            row[:words] = eos_mask(words, self._compiled.eos_ids)
        else:
            self._write_live_mask(row, words)
        row[words:] = 0

    def advance(self, token: int) -> bool:
        if not self._active:
            return True
        if self._finished:
            return False
        if token in self._compiled.eos_ids:
            self._finished = self.accepting
            return self._finished
        return self._consume(token)

    def rollback(self, n: int) -> None:
        if n <= 0 or not self._active:
            return
        if self._finished:
            self._finished, n = False, n - 1
        if n:
            self._take_back(n)

    def _write_live_mask(self, row: np.ndarray, words: int) -> None:
        """Write the backend's mask of the current state into ``row[:words]``."""
        raise NotImplementedError

    def _consume(self, token: int) -> bool:
        """Move the backend past a non-EOS ``token``; False, state unchanged, if refused."""
        raise NotImplementedError

    def _take_back(self, n: int) -> None:
        """Undo the backend's last ``n`` consumed tokens."""
        raise NotImplementedError
