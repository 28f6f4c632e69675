"""Stop strings: match across token boundaries, hold back a possible beginning."""

from __future__ import annotations

from mlxcel.text import partial_suffix


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

