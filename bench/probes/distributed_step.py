"""Probe: what does one tensor-parallel decode step cost on MLX's ring backend over
loopback, without the server, and what do the server's two extra collectives add?

Runs a raw greedy decode loop (mlx-lm's model and KVCache, batch B of one prompt) on the
~30M bench checkpoint, alone and as two ranks (``mx.distributed``, the model's own
``shard``), in three variants: the bare step; + the token broadcast (an all_sum of the B
sampled ids in the graph, as ``DecodeBatch.launch`` does); + the plan broadcast (an all_sum
of a 1 KiB uint8 frame evaluated before each step is built, as rank 0's ``Leader`` does).

    python bench/probes/distributed_step.py            # both: 1 process, then 2 ranks
    python bench/probes/distributed_step.py --rank-run # (what each rank runs)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

STEPS = 48
BATCHES = (1, 8)


def loop(model, cache_fn, group, batch: int, variant: str) -> float:
    """ms per decode step after a 4-step warm-up."""
    import mlx.core as mx

    cache = cache_fn()
    tokens = mx.array([[5, 6, 7, 8, 9, 10, 11, 12]] * batch, dtype=mx.uint32)
    logits = model(tokens, cache=cache)[:, -1, :]
    nxt = mx.argmax(logits, axis=-1).astype(mx.uint32)
    mx.eval(nxt)
    frame = mx.zeros((1024,), mx.uint8)
    t0 = 0.0
    for i in range(STEPS + 4):
        if i == 4:
            t0 = time.perf_counter()
        if variant == "plan" and group is not None:
            mx.eval(mx.distributed.all_sum(frame, group=group))
        logits = model(nxt[:, None], cache=cache)[:, -1, :]
        sampled = mx.argmax(logits, axis=-1).astype(mx.uint32)
        if variant in ("tokens", "plan") and group is not None:
            mine = sampled if group.rank() == 0 else mx.depends(mx.zeros_like(sampled),
                                                                sampled)
            sampled = mx.distributed.all_sum(mine, group=group)
        mx.async_eval(sampled)
        nxt.tolist()  # the previous step's tokens, as the engine reads them back
        nxt = sampled
    mx.eval(nxt)
    return (time.perf_counter() - t0) * 1000 / STEPS


def rank_run() -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model
    from mlxcel.testing.bench_checkpoints import named_checkpoint

    path = named_checkpoint("30m")
    group = mx.distributed.init()
    alone = group.size() == 1
    model, _ = load_model(path, lazy=True)
    model.set_dtype(mx.float32)
    if not alone:
        model.shard(group)
    mx.eval(model.parameters())
    out = {}
    for batch in BATCHES:
        for variant in ("bare",) if alone else ("bare", "tokens", "plan"):
            out[f"B={batch} {variant}"] = round(
                loop(model, lambda: make_prompt_cache(model), None if alone else group,
                     batch, variant), 2)
    if group.rank() == 0:
        print(json.dumps({"ranks": group.size(), "ms_per_step": out}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank-run", action="store_true")
    if ap.parse_args().rank_run:
        rank_run()
        return 0
    me = [sys.executable, __file__, "--rank-run"]
    launch = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()",
              "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1", "--", *me]
    runs = [subprocess.run(cmd, capture_output=True, text=True, check=True,
                           stdin=subprocess.DEVNULL) for cmd in (me, launch)]
    rows = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    print("| run | " + " | ".join(rows[1]["ms_per_step"]) + " |")
    print("|---|" + "---:|" * len(rows[1]["ms_per_step"]))
    for row in rows:
        cells = [str(row["ms_per_step"].get(k, "-")) for k in rows[1]["ms_per_step"]]
        print(f"| {row['ranks']} rank(s), ms/step | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
