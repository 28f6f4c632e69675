"""Where a serving step's time goes: raw decode loop vs mlxcel's engine alone (no HTTP).

Runs mlxcel's ``EngineClient`` in-process (same loader, same --dtype resolution, same
engine thread) with a closed-loop load of C streams and N requests, consuming the events
on an asyncio loop without any HTTP, and reports tok/s and engine steps/s; with
``--profile`` the engine thread runs under cProfile and the top functions by own time are
printed; with ``--timing`` the engine's phases (prefill chunk, join, decode launch, read-back,
row drop, prompt-cache store) are wall-clocked and summarised; ``--repeat R`` runs the load
R times in one process (the first run pays one-time costs such as kernel compilation).
Every run also reports the steady decode step (median interval between consecutive decode
launches of a full batch) and the CPU time per step of the engine thread and of the
consuming (asyncio) thread. ``--raw-steps S`` then times S steps of a raw decode loop
(``bench/gpu/raw_loop.py``'s pipelined greedy loop) on the same model object and the
engine's own cache kind at batch C, in the same process; ``--host-only`` swaps the model's
forward for a trivial one (each cache takes a one-head key/value, logits are a cheap
element-wise function of the input), so engine and raw loop measure host work only;
``--emit-first on|off`` overrides the policy's step order; ``--policy gpu`` runs the
choices CUDA resolves (``gpu_policy``) on this device.

``--build-time`` then measures, once the load is done, the Python time to build one decode
step of C rows (``DecodeBatch.launch`` on the engine's own model, caches and policy, rows
prefilled as one group of the bench prompts, so they are left-padded as served rows are)
against ``bench/gpu/raw_loop.py``'s reference step (``model(inputs, cache)`` + argmax on a
freshly loaded mlx-lm model with its own ``KVCache``, no mlxcel patch), in alternating
rounds on one thread with every step evaluated before the next is built; it prints the
medians and each step's graph (primitives per kind), then the same loops pipelined (step
n+1 built before step n is read back, the engine in both step orders, no consumer thread):
against the served step's period, what the other threads cost. With a deep, narrow checkpoint
(``--checkpoint llama-deep``: Llama-3-8B's 32 layers at tiny width) that is the host's cost
of a GPU decode step (``--checkpoint gemma4-deep``: the same for Gemma-4-E4B's 42
layers). MLX's CPU device composes the ``mx.fast`` kernels (RMSNorm, RoPE, attention) from
plain ops, so CPU graphs have more nodes than GPU ones, in both loops.

Rule: compare it with ``bench/gpu/raw_loop.py`` (model only) and ``bench/serving.py`` (full
server) on the same checkpoint and prompts (``bench_prompt``), so a gap splits into engine
and HTTP/streaming costs.

    blas=$(python -m mlxcel.backend); LD_PRELOAD=$blas python bench/engine_profile.py \
        --checkpoint tiny --concurrency 16 --requests 32 --max-tokens 64 [--profile]
    ... --concurrency 64 --requests 64 --max-tokens 256 --repeat 3 --raw-steps 256 \
        [--host-only]
    ... --checkpoint llama-deep --policy gpu --concurrency 1 --requests 1 --max-tokens 8 \
        --build-time
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pathlib
import pstats
import statistics
import sys
import threading
import time
import uuid

from mlxcel.testing.bench_checkpoints import CHECKPOINTS, bench_checkpoint
from mlxcel.testing.decode_loop import pipelined_greedy
from mlxcel.testing.servers import bench_prompt


async def drive(client, tokenizer, template_render, c: int, n: int, max_tokens: int,
                guided: int = 0, guide=None) -> dict:
    """``guided`` of the ``c`` streams send their requests with ``guide()`` (a compiled
    output constraint, fetched per request as a server does: from the compile cache)."""
    from mlxcel.types import GenerationRequest
    from mlxcel.types.requests import SamplingParams

    prompts = [tokenizer.encode(template_render(bench_prompt("prof", i))) for i in range(n)]
    pending = list(range(n))
    ttfts: list[float] = []
    tokens = 0

    async def stream(k: int) -> None:
        nonlocal tokens
        while pending:
            i = pending.pop()
            t0 = time.perf_counter()
            req = GenerationRequest(
                request_id=uuid.uuid4().hex,
                prompt_tokens=tuple(prompts[i]),
                max_tokens=max_tokens,
                ignore_eos=True,
                sampling=SamplingParams(temperature=0.0),
                guide=guide() if k < guided else None,
            )
            first = None
            async for ev in client.submit(req):
                if first is None and ev.text:
                    first = time.perf_counter() - t0
                if ev.usage is not None:
                    tokens += ev.usage.completion_tokens
            ttfts.append(first or 0.0)

    t0 = time.perf_counter()
    await asyncio.gather(*(stream(k) for k in range(c)))
    wall = time.perf_counter() - t0
    ttfts.sort()
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1e3,
    }


class HostOnly:
    """A loaded model whose forward costs (almost) nothing: every cache takes a key/value
    of one head per token (so caches grow, join, leave and are stored as usual) and the
    logits are a cheap element-wise function of the inputs (-|f - frac(0.618 x)|, f fixed
    per token), so greedy tokens vary."""

    def __init__(self, inner) -> None:
        import mlx.core as mx

        self.inner = inner
        self.model = inner.model
        self.config = inner.config
        self.path = inner.path
        cfg = inner.config.get("text_config", inner.config)
        vocab = cfg["vocab_size"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.freqs = mx.random.uniform(0.0, 1.0, (vocab,), key=mx.random.key(0))

    def make_cache(self):
        return self.inner.make_cache()

    def __call__(self, inputs, cache):
        import mlx.core as mx

        b, t = inputs.shape
        kv = mx.zeros((b, 1, t, self.head_dim), mx.float32)
        for c in cache:
            c.update_and_fetch(kv, kv)
        target = mx.remainder(inputs.astype(mx.float32)[..., None] * 0.6180339, 1.0)
        return -mx.abs(self.freqs - target)


def launch_recorder() -> list[tuple[float, float, int]]:
    """(wall, engine-thread CPU, rows) at every decode launch."""
    from mlxcel.engine import batch

    marks: list[tuple[float, float, int]] = []
    launch = batch.DecodeBatch.launch

    def recorded(self):
        marks.append((time.perf_counter(), time.thread_time(), len(self.rows)))
        return launch(self)

    batch.DecodeBatch.launch = recorded
    return marks


def steady(marks: list[tuple[float, float, int]], rows: int) -> tuple[float, float, int]:
    """Median wall and engine-CPU ms between consecutive launches of ``rows`` rows."""
    walls, cpus = [], []
    for (w0, c0, r0), (w1, c1, r1) in zip(marks, marks[1:], strict=False):
        if r0 == r1 == rows:
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
    if not walls:
        return float("nan"), float("nan"), 0
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3, len(walls)


def switches(native_id: int) -> int:
    """A thread's context switches so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/self/task/{native_id}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    except OSError:
        return 0


def raw_loop(worker, batch: int, steps: int, prompt_len: int = 48,
             own_cache: bool = False) -> dict:
    """``bench/gpu/raw_loop.py``'s pipelined greedy loop on the engine's model (with the
    policy's patches) and cache kind (shared-position ``BatchCache`` or the mixed path's
    merged mlx-lm caches), or with ``own_cache`` the model's own ``make_cache()``."""
    import mlx.core as mx
    from mlxcel.engine.cache.kvcache import BatchCache

    model = worker.checkpoint.model
    if own_cache:
        cache = model.make_cache()
    elif worker.path == "shared":
        cache = [BatchCache([0] * batch, worker.rope) for _ in model.make_cache()]
    else:
        cache = worker.merge([model.make_cache() for _ in range(batch)])
    prompt = mx.random.randint(300, 400, (batch, prompt_len)).astype(mx.uint32)

    def step(y):
        return mx.argmax(model(y[:, None], cache)[:, -1, :], axis=-1).astype(mx.uint32)

    y = mx.argmax(model(prompt, cache)[:, -1, :], axis=-1).astype(mx.uint32)
    mx.eval(y)
    for _ in range(8):
        y = step(y)
        mx.eval(y)
    c0, t0 = time.thread_time(), time.perf_counter()
    pipelined_greedy(step, y, steps)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"ms_per_step": wall / steps * 1e3, "cpu_ms_per_step": cpu / steps * 1e3,
            "tok_s": batch * steps / wall}


class NullSink:
    cancelled = False

    def emit(self, event) -> None: ...


def gpu_policy(config):
    """The choices ``resolve_policy`` makes on CUDA, on this device: fused projections,
    bound submodules, grouped decode attention (the varlen kernel is CUDA's), emit-first,
    lazy leave, held groups, bursts, prefill columns aligned to 32; no warm-up (it pays
    for CUDA's JIT)."""
    import msgspec
    from mlxcel.engine.policy import BURST_CHUNKS, resolve_policy

    config = msgspec.structs.replace(config, fuse_projections=True, decode_attention="grouped")
    return msgspec.structs.replace(resolve_policy(config), hold_groups=True,
                                   burst_chunks=BURST_CHUNKS, lazy_leave=True,
                                   emit_first=True, prefill_align=32, bind_modules=True)


VIEWS = frozenset({"Broadcast", "Reshape", "Transpose", "Slice", "Squeeze", "ExpandDims",
                   "Flatten", "Unflatten", "AsStrided", "StopGradient", "Split"})


def step_graph(*outputs) -> dict[str, int]:
    """The unevaluated graph behind ``outputs``: primitives by name, most frequent first."""
    import collections
    import re
    import tempfile

    import mlx.core as mx

    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *outputs)
        names = re.findall(r'label ="([^"]+)", shape=rectangle', f.read())
    return dict(collections.Counter(names).most_common())


def graph_line(graph: dict[str, int]) -> str:
    """Primitives in all and those that are not views (``VIEWS``: no kernel of their own)."""
    ops = sum(n for k, n in graph.items() if k not in VIEWS)
    return f"{sum(graph.values())} primitives, {ops} not views: " + ", ".join(
        f"{k} {n}" for k, n in graph.items())


class Timed:
    """One loop's decode steps, built and timed one at a time (wall and thread CPU)."""

    graph: dict[str, int] = {}

    def __init__(self) -> None:
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.queues: list[float] = []
        self.reads: list[float] = []

    def run(self, steps: int) -> None:
        import mlx.core as mx

        for _ in range(steps):
            w, c = time.perf_counter(), time.thread_time()
            outputs = self.build()
            q = time.perf_counter()
            self.walls.append(q - w)
            self.cpus.append(time.thread_time() - c)
            if len(self.walls) == 16:
                self.graph = step_graph(*outputs)
            self.queue(outputs)
            self.queues.append(time.perf_counter() - q)
            mx.eval(*outputs)  # the read-back's own cost, without the wait
            r = time.perf_counter()
            self.finish(outputs)
            self.reads.append(time.perf_counter() - r)

    def queue(self, outputs) -> None:
        """Queue the step (``mx.async_eval``; on CUDA this encodes its kernels)."""
        import mlx.core as mx

        mx.async_eval(*outputs)

    def clear(self) -> None:
        self.walls, self.cpus, self.queues, self.reads = [], [], [], []

    def summary(self) -> tuple[float, float, float, float]:
        return tuple(statistics.median(v) * 1e3
                     for v in (self.walls, self.cpus, self.queues, self.reads))


class EngineSteps(Timed):
    """The worker's decode batch (its model, caches, sampler and policy) of ``prompts``."""

    def __init__(self, worker, prompts: list[list[int]], max_tokens: int) -> None:
        from mlxcel.engine.sequence import Sequence
        from mlxcel.types import GenerationRequest
        from mlxcel.types.requests import SamplingParams

        super().__init__()
        seqs = [Sequence(GenerationRequest(request_id=f"build-{i}", prompt_tokens=tuple(p),
                                           max_tokens=max_tokens, ignore_eos=True,
                                           sampling=SamplingParams(temperature=0.0)),
                         NullSink(), worker.checkpoint.tokenizer, worker.eos_ids, i)
                for i, p in enumerate(prompts)]
        job = worker._new_job(seqs)
        while not job.step(1 << 20):
            pass
        from mlxcel.engine.steps import read_back

        self.worker, self.batch = worker, worker._new_batch()
        read_back(self.batch.join([job]), worker.stats)  # the rows' first tokens

    def build(self):
        self.step = self.batch.launch()
        return (self.step.sampled, *self.step.logprobs)

    def queue(self, outputs) -> None:
        self.step.start()

    def finish(self, outputs) -> None:
        from mlxcel.engine.steps import read_back

        read_back(self.step, self.worker.stats)

    def pipelined(self, steps: int, emit_first: bool) -> float:
        """ms per step of ``steps`` steps run as ``EngineWorker._decode_step`` runs them
        (step n+1 built before step n is read back; ``emit_first``: read back before
        queueing), on this thread, with no consumer."""
        from mlxcel.engine.steps import read_back

        prev = None
        t0 = time.perf_counter()
        for _ in range(steps):
            step = self.batch.launch()
            if emit_first and prev is not None:
                read_back(prev, self.worker.stats)
            step.start()
            if not emit_first and prev is not None:
                read_back(prev, self.worker.stats)
            prev = step
        read_back(prev, self.worker.stats)
        return (time.perf_counter() - t0) / steps * 1e3


class ReferenceSteps(Timed):
    """``bench/gpu/raw_loop.py``'s step on a fresh mlx-lm model with its own caches."""

    def __init__(self, path: pathlib.Path, dtype: str, batch: int, prompt_len: int = 48):
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model

        super().__init__()
        self.model, _ = load_model(path)
        if dtype in ("float32", "float16", "bfloat16"):
            self.model.set_dtype(getattr(mx, dtype))
        self.cache = make_prompt_cache(self.model)
        prompt = mx.random.randint(300, 400, (batch, prompt_len)).astype(mx.uint32)
        self.y = self.pick(prompt)
        mx.eval(self.y)

    def pick(self, inputs):
        import mlx.core as mx

        logits = self.model(inputs, cache=self.cache)[:, -1, :]
        return mx.argmax(logits, axis=-1).astype(mx.uint32)

    def build(self):
        self.y = self.pick(self.y[:, None])
        return (self.y,)

    def finish(self, outputs) -> None:
        self.y.tolist()

    def pipelined(self, steps: int) -> float:
        """ms per step of ``bench/gpu/raw_loop.py``'s pipelined loop."""
        t0 = time.perf_counter()
        self.y = pipelined_greedy(lambda y: self.pick(y[:, None]), self.y, steps)
        return (time.perf_counter() - t0) / steps * 1e3


def build_time(worker, path: pathlib.Path, prompts: list[list[int]], rounds: int = 6,
               steps: int = 40) -> None:
    """Engine vs reference build ms per step (see the module docstring), ``rounds``
    alternating rounds of ``steps`` steps each after one untimed round."""
    from mlxcel.engine.accel import attention

    model, choice = worker.checkpoint.model, worker.policy.decode_attention
    engine = EngineSteps(worker, prompts, 4 * (rounds + 1) * steps + 8)
    reference = ReferenceSteps(path, worker.checkpoint.dtype, len(prompts))
    for r in range(rounds + 1):
        if worker.batchable:
            attention.install(model, choice=choice)
        engine.run(steps)
        attention.uninstall(model)  # module-wide: the reference runs MLX's own
        reference.run(steps)
        if r == 0:
            for loop in (engine, reference):
                loop.clear()
    (ew, ec, eq, er), (rw, rc, rq, rr) = engine.summary(), reference.summary()
    print(f"build ms per step at B={len(prompts)} (median of {len(engine.walls)}, "
          f"interleaved): engine {ew:.3f} (CPU {ec:.3f}), reference {rw:.3f} (CPU "
          f"{rc:.3f}); engine / reference = {ew / rw:.3f} (CPU {ec / rc:.3f})", flush=True)
    print(f"queue ms per step (mx.async_eval, the device idle before it): engine {eq:.3f}, "
          f"reference {rq:.3f}; engine / reference = {eq / rq:.3f}", flush=True)
    print(f"read-back ms per step (the step evaluated first): engine {er:.3f}, reference "
          f"{rr:.3f}", flush=True)
    print(f"  engine graph: {graph_line(engine.graph)}", flush=True)
    print(f"  reference graph: {graph_line(reference.graph)}", flush=True)
    # the same loops pipelined on this one thread, no consumer: a served step's period
    # minus the other threads (HTTP side, event hand-off), in both step orders
    orders = {"emit-first": True, "queue-first": False}
    runs: dict[str, list[float]] = {k: [] for k in (*orders, "reference")}
    for _ in range(rounds + 1):
        if worker.batchable:
            attention.install(model, choice=choice)
        for order, emit_first in orders.items():
            runs[order].append(engine.pipelined(steps, emit_first))
        attention.uninstall(model)
        # as many steps as the engine's: both caches grow alike (attention costs grow)
        runs["reference"].append(statistics.median(
            reference.pipelined(steps) for _ in orders))
    med = {k: statistics.median(v[1:]) for k, v in runs.items()}
    print(f"pipelined ms per step (median of {rounds} rounds of {steps}, one thread, no "
          "consumer): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()) + "; engine / "
          "reference = " + " / ".join(f"{med[k] / med['reference']:.3f}" for k in orders),
          flush=True)


def install_timers() -> dict[str, list[tuple[float, float]]]:
    """Wall-clock and engine-thread CPU time of the engine's phases (wrapping the methods
    in place)."""
    from mlxcel.engine import batch, steps, worker

    timings: dict[str, list[tuple[float, float]]] = {}
    targets = [(batch.PrefillJob, "step", "prefill chunk"), (batch.DecodeBatch, "join", "join"),
               (batch.DecodeBatch, "launch", "decode launch"), (steps.Step, "start", "queue"),
               (batch.DecodeBatch, "drop_finished", "drop rows"),
               (worker.EngineWorker, "_read_back", "read back"),
               (worker.EngineWorker, "_settle", "settle"),
               (worker.EngineWorker, "_plan", "plan"), (worker.EngineWorker, "_drain", "drain"),
               (worker.EngineWorker, "_remember", "prompt-cache store"),
               (worker.EngineWorker, "step", "iteration (all)")]
    for cls, name, label in targets:
        def wrap(fn, label=label):
            def timed(*a, **kw):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return fn(*a, **kw)
                finally:
                    timings.setdefault(label, []).append(
                        (time.perf_counter() - t, time.thread_time() - c))
            return timed
        setattr(cls, name, wrap(getattr(cls, name)))
    return timings


def timing_table(timings: dict[str, list[tuple[float, float]]], wall: float) -> str:
    rows = [f"  {'phase':20s} {'calls':>6s} {'total s':>8s} {'share':>6s} {'p50 ms':>8s} "
            f"{'max ms':>8s} {'cpu s':>7s} {'cpu p50 ms':>10s}"]
    for label, pairs in timings.items():
        xs, cs = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
        rows.append(f"  {label:20s} {len(xs):6d} {sum(xs):8.3f} {sum(xs) / wall:6.1%} "
                    f"{xs[len(xs) // 2] * 1e3:8.3f} {xs[-1] * 1e3:8.2f} {sum(cs):7.3f} "
                    f"{cs[len(cs) // 2] * 1e3:10.3f}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="--dtype for the loader (default: auto)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--raw-steps", type=int, default=0,
                    help="then time this many raw-loop steps at batch C (0: none)")
    ap.add_argument("--host-only", action="store_true",
                    help="a trivial forward: measure host work only")
    ap.add_argument("--emit-first", choices=("auto", "on", "off"), default="auto",
                    help="the policy's step order (auto: this device's)")
    ap.add_argument("--policy", choices=("auto", "gpu"), default="auto",
                    help="the engine's device choices (gpu: CUDA's, on this device)")
    ap.add_argument("--build-time", action="store_true",
                    help="then time building a decode step of C rows, engine vs reference")
    ap.add_argument("--schema", default=None,
                    help="a JSON schema (its text, or a file): --guided of the streams obey it")
    ap.add_argument("--guided", type=int, default=0,
                    help="streams whose requests carry the --schema constraint")
    ap.add_argument("--no-cache-prompt", action="store_true",
                    help="turn the prompt cache off (the server's default has it on)")
    args = ap.parse_args()

    from mlxcel.engine.client import EngineClient
    from mlxcel.engine.worker import EngineWorker
    from mlxcel.engines import prompt_cache_from
    from mlxcel.model.loader import load_checkpoint
    from mlxcel.plugins import load_plugins
    from mlxcel.settings import Settings

    if args.model:
        path = pathlib.Path(args.model)
    else:
        kw = dict(CHECKPOINTS[args.checkpoint])
        path = bench_checkpoint(kw.pop("shape"), **kw)
    families = load_plugins().families
    prof = cProfile.Profile() if args.profile else None
    if prof is not None:  # run the engine thread's loop under the profiler
        run = EngineWorker.run

        def profiled(self) -> None:
            prof.runcall(run, self)

        EngineWorker.run = profiled
    timings = install_timers() if args.timing else None
    marks = launch_recorder()

    def load():
        ck = load_checkpoint(str(path), families, dtype=args.dtype)
        if args.host_only:
            ck.model = HostOnly(ck.model)
        return ck

    import msgspec
    from mlxcel.engine.config import EngineConfig
    from mlxcel.engine.policy import resolve_policy

    policy = gpu_policy(EngineConfig()) if args.policy == "gpu" else None
    if args.emit_first != "auto":
        policy = msgspec.structs.replace(policy or resolve_policy(EngineConfig()),
                                         emit_first=args.emit_first == "on")
    client = EngineClient(
        load,
        args.concurrency,
        prefill_chunk=512,
        max_queue_depth=10_000,
        prompt_cache=prompt_cache_from(Settings(no_cache_prompt=args.no_cache_prompt)),
        policy=policy,
    )
    client.start()
    client.worker.ready.wait()
    ck = client.checkpoint
    print(f"{path.name}: device {ck.device}, dtype {ck.dtype}, blas {ck.blas}")

    def render(text: str) -> str:
        return ck.template.render([{"role": "user", "content": text}], add_generation_prompt=True)

    async def one() -> dict:
        s0 = client.worker.stats.decode_steps_processed
        c0 = time.thread_time()
        x0 = switches(client.worker.native_id), switches(threading.get_native_id())
        r = await drive(
            client, ck.tokenizer, render, args.concurrency, args.requests, args.max_tokens,
            args.guided if guide else 0, guide,
        )
        steps = r["decode_steps"] = max(1, client.worker.stats.decode_steps_processed - s0)
        r["consumer_cpu_ms"] = (time.thread_time() - c0) * 1e3 / steps
        r["engine_switches"] = (switches(client.worker.native_id) - x0[0]) / steps
        r["consumer_switches"] = (switches(threading.get_native_id()) - x0[1]) / steps
        return r

    stats: dict[str, list[float]] = {}
    guide = None
    if args.schema:  # compiled once (a cold compile is not what this measures)
        from mlxcel.engine.constraints import ConstraintCompiler
        from mlxcel.types.constraints import JsonSchemaConstraint

        compiler = ConstraintCompiler.for_tokenizer(ck.tokenizer, eos_ids=ck.tokenizer.eos_ids)
        text = args.schema if args.schema.lstrip().startswith("{") \
            else pathlib.Path(args.schema).read_text()
        constraint = JsonSchemaConstraint.from_schema(json.loads(text))
        compiler.compile(constraint)

        def guide():
            return compiler.submit(constraint).result()

    try:
        asyncio.run(drive(client, ck.tokenizer, render, args.concurrency, args.concurrency, 4))
        for run in range(args.repeat):
            if timings is not None:
                timings.clear()
            marks.clear()
            r = asyncio.run(one())
            steps = r["decode_steps"]
            step_ms, cpu_ms, n = steady(marks, args.concurrency)
            for key, value in (("tok_s", r["tok_s"]), ("step_ms", step_ms),
                               ("engine_cpu_ms", cpu_ms),
                               ("consumer_cpu_ms", r["consumer_cpu_ms"]),
                               ("engine_switches", r["engine_switches"]),
                               ("consumer_switches", r["consumer_switches"])):
                stats.setdefault(key, []).append(value)
            print(
                f"[run {run + 1}] engine only, C={args.concurrency} N={args.requests} "
                f"max_tokens={args.max_tokens}: {r['tok_s']:.1f} tok/s, TTFT p50 "
                f"{r['ttft_p50_ms']:.0f} ms, {steps} decode steps, "
                f"{r['wall_s'] / steps * 1e3:.2f} ms per engine iteration, "
                f"mean batch {r['tokens'] / steps:.2f}; steady step {step_ms:.3f} ms "
                f"({n} intervals), engine thread CPU {cpu_ms:.3f} ms/step, consumer "
                f"thread CPU {r['consumer_cpu_ms']:.3f} ms/step; context switches per step: "
                f"engine {r['engine_switches']:.1f}, consumer {r['consumer_switches']:.1f}",
                flush=True
            )
            if timings is not None:
                print(timing_table(timings, r["wall_s"]), flush=True)
    finally:
        client.shutdown()
    print("engine medians over runs: " + ", ".join(
        f"{k} {statistics.median(v):.3f}" for k, v in stats.items()), flush=True)
    if args.raw_steps:  # the engine thread has ended: this thread may use MLX now
        raws, owns = [], []
        for i in range(max(1, args.repeat)):  # interleaved: engine cache, model's own
            raws.append(raw_loop(client.worker, args.concurrency, args.raw_steps))
            owns.append(raw_loop(client.worker, args.concurrency, args.raw_steps,
                                 own_cache=True))
            for what, raw in (("engine cache", raws[-1]), ("model's cache", owns[-1])):
                print(f"[raw {i + 1}, {what}] B={args.concurrency}: {raw['tok_s']:.1f} "
                      f"tok/s, {raw['ms_per_step']:.3f} ms/step, CPU "
                      f"{raw['cpu_ms_per_step']:.3f} ms/step", flush=True)
        raw_ms = statistics.median(r["ms_per_step"] for r in raws)
        own_ms = statistics.median(r["ms_per_step"] for r in owns)
        print(f"raw on the model's own cache: ms_per_step {own_ms:.3f}", flush=True)
        print(f"raw medians: ms_per_step {raw_ms:.3f}, cpu_ms_per_step "
              f"{statistics.median(r['cpu_ms_per_step'] for r in raws):.3f}; engine steady "
              f"step / raw step = {statistics.median(stats['step_ms']) / raw_ms:.3f}",
              flush=True)
    if args.build_time:  # the engine thread has ended: this thread may use MLX now
        build_time(client.worker, path, [ck.tokenizer.encode(render(bench_prompt("build", i)))
                                         for i in range(args.concurrency)])
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
