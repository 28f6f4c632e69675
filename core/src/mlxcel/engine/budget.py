"""A reasoning budget: a row whose reasoning block runs past its budget of tokens gets the
block's close marker forced, token by token, through the output-constraint mask.

It wraps the row's output constraint (or none) as one ``Matcher``, so the batched step's
masks (``engine.masks``) need no second mechanism: while the close marker is being forced
the only allowed token is its next one; otherwise the inner constraint decides (a
constraint that starts after the reasoning starts when the forced marker's text appears,
``GenerationRequest.guide_after``). The block's boundaries are found in the row's decoded
text, as the chat layer finds them, with a tail kept for markers split over tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ReasoningBudget:
    """One row's budget over its (optional) inner matcher. ``observe`` is fed each token's
    decoded text after ``advance``; a block counts the tokens generated inside it."""

    def __init__(self, inner: Any, budget: int, open_text: str, close_text: str,
                 close_ids: tuple[int, ...], inside: bool) -> None:
        self.inner, self.budget = inner, budget
        self.open_text, self.close_text, self.close_ids = open_text, close_text, close_ids
        self.inside = inside
        self.used = 0  # tokens generated inside reasoning blocks so far
        self._forcing: list[int] = []
        self._tail = ""
        if inside and budget <= 0:
            self._forcing = list(close_ids)

    @property
    def active(self) -> bool:
        return bool(self._forcing) or (self.inner is not None and self.inner.active)

    @property
    def waiting(self) -> bool:
        """The inner constraint has not started yet (it waits for ``guide_after``), even
        while the close marker is being forced."""
        return self.inner is not None and not self.inner.active

    @property
    def accepting(self) -> bool:
        return not self._forcing and self.inner is not None and self.inner.accepting

    @property
    def finished(self) -> bool:
        return self.inner is not None and self.inner.finished

    def start(self) -> None:
        if self.inner is not None:
            self.inner.start()

    def write_mask_into(self, row: np.ndarray) -> None:
        if self._forcing:
            row[:] = 0
            token = self._forcing[0]
            row.view(np.uint32)[token // 32] = np.uint32(1 << (token % 32))
        elif self.inner is not None:
            self.inner.write_mask_into(row)
        else:
            row[:] = -1

    def advance(self, token: int) -> bool:
        if self._forcing:
            if token != self._forcing[0]:
                return False
            self._forcing.pop(0)
            return True
        return True if self.inner is None else self.inner.advance(token)

    def observe(self, text: str) -> None:
        """The decoded text of the token just taken: count it, track the block's open and
        close markers, and start forcing the close once the budget is spent."""
        if self.inside:
            self.used += 1
        seen = self._tail + text
        marker = self.close_text if self.inside else self.open_text
        if marker and marker in seen:
            self.inside = not self.inside
            seen = seen[seen.index(marker) + len(marker):]
        keep = max(len(self.open_text), len(self.close_text))
        self._tail = seen[-keep:] if keep else ""
        if self.inside and not self._forcing and self.used >= self.budget:
            self._forcing = list(self.close_ids)
