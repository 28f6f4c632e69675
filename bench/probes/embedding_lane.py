"""Probe: how near the raw loop does the job lane run an embedder, engine only (no HTTP),
with and without the overlap (a batch read after the next one is queued)?

Four modes over the same inputs (~100-token texts, unique per input), in batches of
``--batch``, on one thread, alternating for ``--rounds`` rounds, medians reported:

- ``raw``: mlx-vlm's model called on one fixed padded batch, ``mx.eval`` each time (what
  ``bench/embeddings.py``'s raw loop times);
- ``runner``: the family's runner over each batch, read at once (its padding, pooling and
  read-back included);
- ``lane``: jobs of ``--batch`` inputs each queued on a ``JobLane`` and run as a side-only
  engine thread runs them, each batch read at once;
- ``lane-overlap``: the same, the runner's ``Later`` read after the next batch is queued.

    .venv/bin/python bench/probes/embedding_lane.py --checkpoint 30m
    python3 bench/probes/embedding_lane.py --checkpoint bert-base --dtype bfloat16   # GPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import sys
import tempfile
import time


def _bench_embeddings():
    """``bench/embeddings.py`` as a module: its checkpoint shapes and input texts."""
    where = pathlib.Path(__file__).resolve().parents[1] / "embeddings.py"
    spec = importlib.util.spec_from_file_location("embeddings_bench", where)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its msgspec structs resolve their annotations here
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="30m", help="a bench/embeddings.py shape, or a path")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=32, help="batches per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the result here too")
    args = ap.parse_args()

    bench = _bench_embeddings()
    build, text = bench.build, bench.text
    import mlx.core as mx
    from mlx_vlm.embedding_loader import load_embedding_model
    from mlxcel.engine.lanes import Job, JobLane, LaneLimits
    from mlxcel.families.api import LoadOptions
    from mlxcel.families.tasks import TaskOptions, resolved
    from mlxcel_family_embeddings.load import load
    from mlxcel_family_embeddings.runners import embedder

    path = pathlib.Path(args.checkpoint)
    if not path.exists():
        root = pathlib.Path(tempfile.gettempdir()) / "mlxcel-bench-embedders"  # the bench's
        path = build(args.checkpoint, root, args.dtype)
    runner = embedder(load(str(path), LoadOptions()), TaskOptions())
    n = args.batch * args.batches
    inputs = runner.tokenize_batch([text("probe", i) for i in range(n)])
    batches = [inputs[i:i + args.batch] for i in range(0, n, args.batch)]
    pooling = runner.pooling

    raw_model = load_embedding_model(path)
    width = max(len(e) for e in batches[0])
    ids = mx.array([e.ids + [0] * (width - len(e)) for e in batches[0]])
    mask = mx.array([[1] * len(e) + [0] * (width - len(e)) for e in batches[0]])

    def raw() -> None:
        for _ in batches:
            mx.eval(raw_model(ids, attention_mask=mask).text_embeds)

    def runner_sync() -> None:
        for batch in batches:
            resolved(runner.embed(batch, pooling))

    def lane(overlap: bool) -> None:
        lane = JobLane()
        limits = LaneLimits(depth=len(batches) + 1, timeout_s=600, batch_items=args.batch)
        fn = ((lambda b: runner.embed(b, pooling)) if overlap
              else (lambda b: resolved(runner.embed(b, pooling))))
        jobs = [Job("embed", "k", batch, fn) for batch in batches]
        for job in jobs:
            lane.submit(job, limits)
        while lane.pending() or lane._inflight is not None:
            lane.run_due(decoding=False)
        assert all(job.done_count == len(job.items) for job in jobs)

    modes = {"raw": raw, "runner": runner_sync, "lane": lambda: lane(False),
             "lane-overlap": lambda: lane(True)}
    for fn in modes.values():  # every shape once before timing
        fn()
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            fn()
            rates[name].append(n / (time.perf_counter() - t0))
    out = {"checkpoint": args.checkpoint, "dtype": args.dtype, "batch": args.batch,
           "device": str(mx.default_device()),
           "inputs_per_s": {m: round(statistics.median(v), 1) for m, v in rates.items()},
           "rounds": {m: [round(x, 1) for x in v] for m, v in rates.items()}}
    out["vs_raw"] = {m: round(v / out["inputs_per_s"]["raw"], 3)
                     for m, v in out["inputs_per_s"].items()}
    print(json.dumps(out))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
