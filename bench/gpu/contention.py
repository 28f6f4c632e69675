"""Does other CPU load slow a host-bound decode step, and does pinning help?

A decode step on CUDA is host-bound (``step_split.py``: build the graph in Python, then
``mx.async_eval`` encodes ~900 kernels). In the serving benchmark the engine shares the
machine with the HTTP side and the load-generating clients, and the engine trace shows
stretches of steps 1.5-2x slower than others. This probe times the engine's decode step
(mlxcel's cache, ragged rows, ``--attention``) alone, next to N busy-looping processes, and
with the step pinned to one CPU (and the burners kept off it and its hyperthread sibling).

    python bench/gpu/contention.py --model CKPT [--batch 64] [--steps 150]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

from raw_loop import make_cache
from step_split import timed_steps


def burn(cpus: list[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    x = 0
    while True:
        x += 1


def siblings(cpu: int) -> list[int]:
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    try:
        text = open(path).read().strip()
    except OSError:
        return [cpu]
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def steps(model, cache, y, n: int) -> tuple[float, float, float, float]:
    """Step p50 / p90, build p50, queue p50 (ms) of ``n`` steps (``step_split``'s loop)."""
    build, queue, wait = timed_steps(model, cache, y, n)
    times = sorted(b + q + w for b, q, w in zip(build, queue, wait, strict=True))
    return (statistics.median(times) * 1e3, times[int(0.9 * len(times))] * 1e3,
            statistics.median(build) * 1e3, statistics.median(queue) * 1e3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--attention", default="varlen")
    args = ap.parse_args()
    import mlx.core as mx
    from mlx_lm import load
    from mlxcel.engine import attention

    ncpu = os.cpu_count() or 1
    print(f"cpus {ncpu}; cpu0 siblings {siblings(0)}", flush=True)
    model, _ = load(args.model)
    attention.install(model, enable=True, choice=args.attention)
    pads = [(i % 16) for i in range(args.batch)]
    all_cpus = sorted(os.sched_getaffinity(0))
    mine = siblings(all_cpus[0])
    others = [c for c in all_cpus if c not in mine]
    ctx = mp.get_context("spawn")
    for label, burners, pin in [
        ("alone", 0, False), (f"{ncpu // 2} burners", ncpu // 2, False),
        (f"{ncpu - 2} burners", ncpu - 2, False), (f"{ncpu} burners", ncpu, False),
        (f"{ncpu - 2} burners, pinned", ncpu - 2, True), ("alone", 0, False),
    ]:
        procs = [ctx.Process(target=burn, args=(others if pin else None,), daemon=True)
                 for _ in range(burners)]
        for p in procs:
            p.start()
        time.sleep(1.0 if burners else 0.1)
        os.sched_setaffinity(0, [mine[0]] if pin else all_cpus)
        cache = make_cache(model, "mlxcel-shared", pads)
        y = mx.argmax(model(mx.random.randint(300, 400, (args.batch, 48)), cache=cache)[:, -1],
                      axis=-1)
        mx.eval(y)
        med, p90, build, queue = steps(model, cache, y, args.steps)
        print(f"{label:<24} step p50 {med:6.2f} ms  p90 {p90:6.2f}  build {build:5.2f}  "
              f"queue {queue:5.2f}", flush=True)
        for p in procs:
            p.kill()
        os.sched_setaffinity(0, all_cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
