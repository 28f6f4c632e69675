"""String helpers for text that arrives in pieces, shared by the engine and the layers above.

A stream is cut wherever tokens end, so a marker (a stop string, a tool call's opening tag)
may arrive split across pieces. These helpers say how much of the text seen so far must be
held back until the next piece settles it, and where the first marker stands. They live
below both the engine and the tool-call kit so that neither imports the other.
"""

from __future__ import annotations


def partial_suffix(buf: str, needles: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of one of
    ``needles``: what must be held back until the next text says whether it completes."""
    best = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(buf)), best, -1):
            if buf.endswith(needle[:n]):
                best = n
                break
    return best


def first_of(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    """The earliest of ``markers`` in ``text`` from ``start`` (the longest at a tie), as
    (position, marker); (-1, "") when none is there."""
    best, found = -1, ""
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best < 0 or at < best or (at == best and len(marker) > len(found))):
            best, found = at, marker
    return best, found


class StopMatcher:
    """Feed decoded text; get back what is safe to emit and whether a stop matched.

    The stop text itself is never emitted. Text that might be the start of a stop string
    stays held until the next piece resolves it.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None  # the stop string that matched, once one did

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda hit: hit[0])
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buf: str) -> int:
        return partial_suffix(buf, self.stops)
