"""A server's process tree and its memory, read from Linux ``/proc``.

A server process is Granian's parent; the engine runs in a worker below it, and constraint
compiles may fork more. A fault test or probe that bounds memory or kills a worker needs
the whole tree, so both read it here the same way.
"""

from __future__ import annotations

import pathlib
from typing import Any


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants, through each thread's ``children`` list."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def rss_bytes(server: Any) -> int:
    """Summed resident memory (VmRSS) of ``server``'s process tree; 0 once it is gone."""
    total = 0
    for pid in tree_pids(server.proc.pid) if server.alive() else []:
        try:
            for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total
