"""Probe: what does speculation give inside the batch, engine only (no HTTP)?

Greedy requests on a bench checkpoint at concurrency 1 and 8, each run four ways in one
process, in turn: ``--prompt-lookup off``, ``on`` (row governor only), ``auto`` (row and
batch governors), and ``wrong``: a drafter that always proposes a token the model never
picks (the bench checkpoints' EOS, whose output row is zero), under both governors, the
bottom of the acceptance range, where the governors must hold the speed of ``off``. Two
workloads: ``copy`` (prompts that repeat a passage, the case prompt
lookup is for; random weights also fall into loops that it copies) and ``fresh`` (prompts
with no repeat). Reports aggregate tokens/s, the speed-up over ``off``, the acceptance
(accepted / drafted) and whether the outputs equal ``off``'s, per pass; the median pass
is the answer.

    .venv/bin/python bench/probes/speculative.py --checkpoint 30m --passes 3
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pathlib
import pstats
import random
import statistics
import time

from mlxcel.engine.config import EngineConfig
from mlxcel.testing.bench_checkpoints import named_checkpoint
from mlxcel.testing.engine import ListSink, request, run_until_done, worker_for
from mlxcel.testing.stub_drafters import StubDrafter

LOOKUP = "mlxcel.drafters.lookup:new_session"
MODES = {"off": None, "on": "on", "auto": "auto", "wrong": "auto"}


class AlwaysWrong(StubDrafter):
    """Drafts ``token`` as far as the row may."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, rows, limits):
        return [[self.token] * limit for limit in limits]


def prompts(kind: str, n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if kind == "copy":
            passage = [rng.randrange(100, vocab) for _ in range(48)]
            out.append(passage * 4)
        else:
            out.append([rng.randrange(100, vocab) for _ in range(192)])
    return out


def one_run(path, mode, batch, max_tokens, policy=None):
    lookup = MODES[mode]
    drafter = AlwaysWrong(eos_id(path)) if mode == "wrong" else LOOKUP
    config = EngineConfig() if lookup is None else EngineConfig(
        drafter=drafter, prompt_lookup=lookup, draft_max=16)
    worker = worker_for(path, parallel=len(batch), config=config, **(policy or {}))
    sinks = []
    start = time.perf_counter()
    for p in batch:
        sink = ListSink()
        worker.enqueue(request(p, max_tokens), sink)
        sinks.append(sink)
    run_until_done(worker, sinks)
    wall = time.perf_counter() - start
    usages = [s.last.usage for s in sinks]
    tokens = sum(u.completion_tokens for u in usages)
    drafted = sum(u.draft_n for u in usages)
    accepted = sum(u.draft_n_accepted for u in usages)
    return {"tok_s": tokens / wall, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "steps": worker.stats.decode_steps_processed,
            "outputs": [s.tokens for s in sinks]}


def eos_id(path) -> int:
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    return eos[0] if isinstance(eos, list) else eos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="30m", help="a bench checkpoint name or a path")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--json", default=None)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="of " + ",".join(MODES) + " (off always runs)")
    ap.add_argument("--verify-stages", default=None, metavar="N,M",
                    help="run each drafting mode once per EnginePolicy.verify_stages value "
                         "(mode@N in the rows); default: the device's policy")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="skip the engine's warm-up (CUDA's policy runs it at each run's "
                         "setup; the first, discarded run then takes the first shapes)")
    ap.add_argument("--profile", default=None, metavar="MODE",
                    help="cProfile MODE's passes; print where the engine thread's time goes")
    args = ap.parse_args()
    given = pathlib.Path(args.checkpoint)
    path = given if given.is_dir() else named_checkpoint(args.checkpoint)
    modes = ["off", *(m for m in args.modes.split(",") if m != "off")]  # off: the baseline
    stages = [int(x) for x in args.verify_stages.split(",")] if args.verify_stages else None
    if stages:  # mode@N: mode with the verify forward queued in N parts
        modes = ["off", *(f"{m}@{n}" for m in modes if m != "off" for n in stages)]
    profile = cProfile.Profile() if args.profile else None
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    results = []
    for kind in ("copy", "fresh"):
        for c in (int(x) for x in args.concurrency.split(",")):
            batch = prompts(kind, c, vocab, seed=c)
            base_policy = {"warm_up": False} if args.no_warm_up else {}
            one_run(path, "off", batch, 8, base_policy or None)  # warm
            passes = {m: [] for m in modes}
            for _ in range(args.passes):
                for mode in modes:
                    if mode == args.profile:
                        profile.enable()
                    name, _, n = mode.partition("@")
                    policy = {**base_policy, **({"verify_stages": int(n)} if n else {})}
                    passes[mode].append(one_run(path, name, batch, args.max_tokens,
                                                policy or None))
                    if mode == args.profile:
                        profile.disable()
            base = statistics.median(r["tok_s"] for r in passes["off"])
            for mode, runs in passes.items():
                rate = statistics.median(r["tok_s"] for r in runs)
                acc = [r["acceptance"] for r in runs if r["acceptance"] is not None]
                same = all(r["outputs"] == passes["off"][0]["outputs"] for r in runs)
                row = {"workload": kind, "c": c, "mode": mode, "tok_s": round(rate, 1),
                       "vs_off": round(rate / base, 2),
                       "acceptance": round(statistics.median(acc), 2) if acc else None,
                       "passes_tok_s": [round(r["tok_s"], 1) for r in runs],
                       "same_output_as_off": same}
                results.append(row)
                print(json.dumps(row), flush=True)
    if profile is not None:
        # MLX's functions are not C functions to cProfile: the time a call spends in MLX
        # (an evaluation's wait for the device included) is its Python caller's own time
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checkpoint": args.checkpoint, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
