"""Server CPU per SSE chunk: Litestar's ``Stream`` response vs a raw ASGI route.

Starts Granian (1 worker) on ``bench/probes/sse/app.py``, whose two routes stream the same
pre-encoded chunk N times (an ``await asyncio.sleep(0)`` between chunks, like a stream
waiting for its next engine event), reads C concurrent streams of each with httpx and
reports the Granian worker's CPU seconds per chunk. It bounds what a leaner SSE response
class could save on the HTTP side of mlxcel's streaming routes.

    python bench/probes/sse/overhead.py [--streams 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


async def measure(port: int, path: str, pid: int, streams: int) -> tuple[int, float, float]:
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one() -> int:
            n = 0
            async with client.stream("GET", f"http://127.0.0.1:{port}{path}") as r:
                async for chunk in r.aiter_bytes():
                    n += chunk.count(b"data:")
            return n

        c0, t0 = cpu_seconds(pid), time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        return sum(counts), time.perf_counter() - t0, cpu_seconds(pid) - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    granian = pathlib.Path(sys.executable).with_name("granian")
    proc = subprocess.Popen([str(granian), "--interface", "asgi", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "app:app"],
                            cwd=pathlib.Path(__file__).parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/missing", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        worker = int(subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()[0])
        for _ in range(args.rounds):
            for path in ("/litestar", "/raw"):
                n, wall, cpu = asyncio.run(measure(port, path, worker, args.streams))
                print(f"{path:10s} {n} chunks in {wall:.2f} s, worker CPU {cpu:.2f} s = "
                      f"{cpu / n * 1e6:.1f} us per chunk", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
