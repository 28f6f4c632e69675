"""Helpers of end-to-end tests: a served app's HTTP client, and generated doc tables.

``server_client(args)``: an ``mlxcel-server`` process started with ``args`` and an httpx
client of it, stopped when the ``with`` ends, for a fixture that only talks HTTP.
``replace_between(text, begin, end, body)``: ``text`` with what stands between two marker
lines replaced, for a test that checks a generated table in a doc is current (and
rewrites it when run as a script); ``GeneratedBlock`` is that check and rewrite for one
file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from mlxcel.testing.servers import MlxcelServer


@contextmanager
def server_client(args: list[str], timeout: float = 60, **client: Any) -> Iterator[Any]:
    """An httpx client of a server process started with ``args``; the process stops after."""
    import httpx

    server = MlxcelServer(args)
    try:
        with httpx.Client(base_url=server.base_url, timeout=timeout, **client) as c:
            yield c
    finally:
        server.stop()


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with the part between ``begin`` and ``end`` (markers kept) set to ``body``."""
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


class GeneratedBlock(NamedTuple):
    """A block of ``path`` between ``begin`` and ``end`` that ``build()`` generates (a doc
    table from a code table); ``script`` regenerates it when run."""

    path: Path
    begin: str
    end: str
    build: Callable[[], str]
    script: str

    def check(self) -> str:
        """The file's text, after asserting that its block is what ``build()`` gives."""
        text = self.path.read_text(encoding="utf-8")
        assert text == replace_between(text, self.begin, self.end, self.build()), \
            f"run `python {self.script}` to regenerate {self.path.name}"
        return text

    def write(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        self.path.write_text(replace_between(text, self.begin, self.end, self.build()),
                             encoding="utf-8")
