"""Probe: what does a GBNF grammar (llguidance) cost beside a JSON schema (outlines-core):
compile time, and the engine thread's per-step mask cost at batch 16?

On the ``30m`` bench checkpoint's vocabulary (8,192 tokens), three output shapes are each
written twice, as a JSON schema (the ``response_format`` path, outlines-core) and as the
GBNF grammar that matches the same text (the ``grammar`` path, llguidance):

- ``notes``: an object with one long lowercase string (the structured-output bench's
  schema: every row keeps decoding inside the string);
- ``record``: an object of a bounded string, an integer, a boolean and an enum;
- ``any-json``: any JSON value (the schema ``{}``; llama.cpp's ``json.gbnf``).

Compile: ``ConstraintCompiler.compile`` on an empty cache directory (a worker process
round trip, as a running server pays it cold), then from disk (a fresh compiler on the
filled directory), ``--runs`` times each, with the backends made and the worker pool
started once beforehand (those one-off costs are printed apart); the in-process backend
build alone is timed too.
Per step: 16 rows, each its own matcher of the constraint, walk the allowed tokens at
random (each row its own seed, as sampled rows diverge); a step is what the engine thread
does for them: ``engine.masks.apply_masks`` over a [16, V] float32 logits block (each
row's ``write_mask_into``, the bit expansion and ``mx.where``, evaluated), then each
row's ``advance``. Rows that end restart. Median and p95 over ``--steps`` steps after a
warm-up, and the share of a batch-16 decode step of the same checkpoint (timed here:
``mlxcel.testing.decode_loop.pipelined_greedy``, 16 rows, no constraint).

    .venv/bin/python bench/probes/grammar_masks.py [--runs 5] [--steps 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

NOTES_SCHEMA = {"type": "object", "properties": {
    "notes": {"type": "string", "pattern": "[a-z ]{300,}"}}, "required": ["notes"]}
NOTES_GBNF = r'''root ::= "{" ws "\"notes\"" ws ":" ws "\"" [a-z ]{300,} "\"" ws "}"
ws ::= " "?'''
RECORD_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
    "member": {"type": "boolean"}, "kind": {"enum": ["person", "company", "place"]}},
    "required": ["name", "age", "member", "kind"]}
RECORD_GBNF = r'''root ::= "{" ws "\"name\"" ws ":" ws name ws "," ws "\"age\"" ws ":" ws int ws "," ws "\"member\"" ws ":" ws ("true" | "false") ws "," ws "\"kind\"" ws ":" ws kind ws "}"
name ::= "\"" char{0,24} "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
int ::= "-"? ("0" | [1-9] [0-9]{0,15})
kind ::= "\"person\"" | "\"company\"" | "\"place\""
ws ::= " "?'''
# llama.cpp's grammars/json.gbnf (any JSON value), whitespace bounded as outlines' is
ANY_GBNF = r'''root ::= value
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})?
ws ::= " "?'''
CASES = {"notes": (NOTES_SCHEMA, NOTES_GBNF), "record": (RECORD_SCHEMA, RECORD_GBNF),
         "any-json": ({}, ANY_GBNF)}
BATCH = 16


def constraints(name: str) -> dict:
    from mlxcel.types.constraints import GrammarConstraint, JsonSchemaConstraint

    schema, grammar = CASES[name]
    return {"json schema (outlines-core)": JsonSchemaConstraint.from_schema(schema),
            "gbnf (llguidance)": GrammarConstraint(grammar=grammar)}


def timed_compiles(vocab, constraint, runs: int, work: pathlib.Path, backends: dict) -> dict:
    """Median cold and from-disk compiles through ``ConstraintCompiler``, as a running
    server pays them: its worker pool started and its backends (``backends``, shared
    across the compilers here, holding llguidance's tokenizer) made."""
    from mlxcel.engine.constraints import ConstraintCompiler

    def compiler(cache: pathlib.Path) -> ConstraintCompiler:
        return ConstraintCompiler(vocab, cache_dir=cache, **backends)

    cold, disk, build = [], [], []
    for _ in range(runs):
        cache = pathlib.Path(tempfile.mkdtemp(dir=work))
        t = time.perf_counter()
        compiler(cache).compile(constraint)
        cold.append(time.perf_counter() - t)
        fresh = compiler(cache)
        t = time.perf_counter()
        fresh.compile(constraint)
        disk.append(time.perf_counter() - t)
        assert fresh.stats.disk_hits == 1
        backend = fresh.backend_for(constraint)
        t = time.perf_counter()
        compiled = backend.compile(constraint, vocab)
        build.append(time.perf_counter() - t)
    size = len(backend.dump(compiled))
    return {"cold_ms": 1e3 * statistics.median(cold), "disk_ms": 1e3 * statistics.median(disk),
            "build_ms": 1e3 * statistics.median(build), "dump_bytes": size}


def first_use(vocab, work: pathlib.Path) -> tuple[dict, dict]:
    """The one-off costs a server pays at its first constraint of each kind (a worker
    process started; llguidance's tokenizer built), and the backends, made."""
    from mlxcel.engine.constraints import ConstraintCompiler, LLGuidanceBackend, OutlinesBackend
    from mlxcel.types.constraints import GrammarConstraint, JsonSchemaConstraint

    backends = {"backend": OutlinesBackend(), "grammar_backend": LLGuidanceBackend()}
    costs = {}
    for name, kind in (("outlines-core", lambda i: JsonSchemaConstraint.from_schema(
            {"type": "string", "maxLength": i})),
                       ("llguidance", lambda i: GrammarConstraint(grammar=f'root ::= "{i}"'))):
        for i in range(2):  # the pool's two worker slots, each started on its first use
            t = time.perf_counter()
            ConstraintCompiler(vocab, cache_dir=pathlib.Path(tempfile.mkdtemp(dir=work)),
                               **backends).compile(kind(i + 1))
            costs.setdefault(name, 1e3 * (time.perf_counter() - t))
    t = time.perf_counter()
    LLGuidanceBackend().tokenizer(vocab)
    costs["llguidance tokenizer"] = 1e3 * (time.perf_counter() - t)
    return costs, backends


class _Row:
    """What ``apply_masks`` reads of an engine row."""

    def __init__(self, matcher) -> None:
        self.matcher, self.finished = matcher, False


def mask_steps(vocab, compiled, steps: int, warmup: int) -> list[float]:
    """Seconds per step of 16 guided rows (module docstring)."""
    import mlx.core as mx
    import numpy as np
    from mlxcel.engine.masks import apply_masks

    rows = [_Row(compiled.matcher()) for _ in range(BATCH)]
    rngs = [np.random.default_rng(i) for i in range(BATCH)]
    logits = mx.zeros((BATCH, vocab.size), dtype=mx.float32)
    mx.eval(logits)

    def guard(i, fn, *args):
        return fn(*args)

    out = []
    for step in range(warmup + steps):
        t = time.perf_counter()
        masked = apply_masks(logits, rows, list(range(BATCH)), guard)
        allowed = np.array(masked > -np.inf)
        mid = time.perf_counter()
        picks = [int(rngs[i].choice(np.flatnonzero(allowed[i]))) for i in range(BATCH)]
        t2 = time.perf_counter()
        for row, token in zip(rows, picks, strict=True):
            assert row.matcher.advance(token)
        done = time.perf_counter()
        if step >= warmup:
            out.append((mid - t) + (done - t2))  # the sampling stand-in is not counted
        for i, row in enumerate(rows):
            if row.matcher.finished:
                rows[i] = _Row(compiled.matcher())
    return out


def decode_step_ms(path: pathlib.Path, steps: int) -> float:
    """A batch-16 greedy decode step of the checkpoint through mlx-lm in float32, no
    constraint (median ms of three pipelined runs)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache
    from mlxcel.testing.decode_loop import pipelined_greedy

    model, _ = load(str(path))
    model.set_dtype(mx.float32)  # what the server runs on a CPU (--dtype auto)
    times = []
    for _ in range(3):
        cache = make_prompt_cache(model)
        prompt = mx.random.randint(300, 400, (BATCH, 32)).astype(mx.uint32)

        def step(y, cache=cache):
            return mx.argmax(model(y[:, None], cache)[:, -1, :], axis=-1).astype(mx.uint32)

        y = mx.argmax(model(prompt, cache)[:, -1, :], axis=-1).astype(mx.uint32)
        mx.eval(y)
        t = time.perf_counter()
        pipelined_greedy(step, y, steps)
        times.append((time.perf_counter() - t) / steps)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--tokenizer", type=pathlib.Path, default=None,
                    help="another tokenizer directory for the compile and mask costs (the "
                         "decode step stays the 30m checkpoint's)")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()

    from mlxcel.engine.constraints import ConstraintCompiler, TokenVocabulary
    from mlxcel.model.tokenizer import Tokenizer
    from mlxcel.testing.bench_checkpoints import named_checkpoint

    path = named_checkpoint("30m")
    vocab = TokenVocabulary.from_tokenizer(Tokenizer.from_dir(args.tokenizer or path))
    step_ms = decode_step_ms(path, 32)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        once, backends = first_use(vocab, work)
        for case in CASES:
            for backend, constraint in constraints(case).items():
                row = {"case": case, "backend": backend,
                       **timed_compiles(vocab, constraint, args.runs, work, backends)}
                compiled = ConstraintCompiler(vocab, cache_dir=work / "steps",
                                              **backends).compile(constraint)
                per = mask_steps(vocab, compiled, args.steps, args.warmup)
                row["step_ms_p50"] = 1e3 * statistics.median(per)
                row["step_ms_p95"] = 1e3 * statistics.quantiles(per, n=20)[-1]
                row["share_of_decode_step"] = row["step_ms_p50"] / step_ms
                results.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nvocabulary {vocab.size}; batch-16 decode step of the 30m checkpoint (no "
          f"constraint) {step_ms:.2f} ms; first use: "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in once.items()) + "\n")
    print("| case | backend | cold compile | from disk | build in process | dump | "
          "mask step p50 / p95 (16 rows) | share of a decode step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['case']} | {r['backend']} | {r['cold_ms']:.1f} ms | {r['disk_ms']:.2f} ms "
              f"| {r['build_ms']:.1f} ms | {r['dump_bytes'] / 1024:.1f} KiB | "
              f"{r['step_ms_p50']:.2f} / {r['step_ms_p95']:.2f} ms | "
              f"{100 * r['share_of_decode_step']:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps({"vocab": vocab.size, "decode_step_ms": step_ms,
                                         "first_use_ms": once, "rows": results},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
