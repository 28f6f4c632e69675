"""Probe: how long does a JSON schema take to compile, cold and from the persistent cache?
And (``--grammars``) a forced tool call's grammar, Qwen3-Coder's and Gemma 4's, cold?

For byte-level BPE vocabularies of 4k and 32k tokens (trained here, offline, on the Python
standard library's sources), every schema of the test corpus
(core/tests/data/constraint_schemas.json) plus the issue's nested schema is compiled by
``ConstraintCompiler`` three ways: cold (empty cache directory), from disk (a fresh
compiler on the filled directory: what a restarted server pays) and from memory. It
prints median and p95 per vocabulary, the one-off vocabulary build, the index sizes, and
the cost of writing one mask row (a state seen before vs a new one). The disk reads come
right after the writes, so they are served from the page cache, as a restart soon after
a run would be.

    .venv/bin/python bench/probes/constraint_compile.py [--vocab 4096 32768] [--json OUT]

``--grammars`` compiles instead the forced-call grammar of a 1-tool and an 8-tool request
(``GRAMMAR_TOOLS``: a weather-like tool of six typed parameters, and seven variants) for
the ``qwen3_coder`` and ``gemma4`` formats (and ``hermes``, the same tools as JSON in
``<tool_call>``, for reference), on the same vocabularies with the formats' markers added
as special tokens; each compile is cold (a fresh compiler on an empty cache
directory, its marker vocabulary built beforehand, as a server that has compiled once
has it), ``--runs`` times, and the table gives the median, the pattern's size, the index
states and the serialized index.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "core" / "tests" / "data" / "constraint_schemas.json"
NESTED = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "kind": {"enum": ["person", "company", "place", "other"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b c", "d", "e f g"]}, "maxItems": 5},
    "contacts": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "email": {"type": "string", "format": "email"},
        "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
        "primary": {"type": "boolean"}}, "required": ["email", "primary"]}},
    "score": {"type": "number"}}, "required": ["name", "kind", "tags"]}


def train_tokenizer(vocab_size: int, out: pathlib.Path) -> pathlib.Path:
    """A byte-level BPE of ``vocab_size`` tokens in ``out`` (reused when present)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = out / f"bpe-{vocab_size}"
    if (path / "tokenizer.json").exists():
        return path
    files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train([str(f) for f in files], trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


MARKERS = ("<tool_call>", "</tool_call>", "<|tool_call>", "<tool_call|>", '<|"|>')
GRAMMARS = {"qwen3_coder": "mlxcel_toolcall_qwen3_coder.grammar:grammar",
            "gemma4": "mlxcel_family_gemma4.grammar:grammar",
            "hermes": "mlxcel.builtin.toolcalls.grammars:hermes"}  # JSON, for reference


def grammar_tools(n: int) -> tuple:
    """``n`` tools of the bench's shape: six typed parameters, three required."""
    from mlxcel.types.messages import Tool

    def one(i: int) -> Tool:
        params = {"type": "object", "required": ["city", "unit", f"days_{i}"], "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit", "kelvin"]},
            f"days_{i}": {"type": "integer"}, "hourly": {"type": "boolean"},
            "fields": {"type": "array", "items": {"type": "string"}},
            "note": {"type": ["string", "null"]}}}
        name = f"get_weather_{i}"
        return Tool(name=name, definition={"type": "function", "function": {
            "name": name, "parameters": params}})

    return tuple(one(i) for i in range(n))


def marker_tokenizer(vocab_size: int, work: pathlib.Path) -> pathlib.Path:
    """The probe's BPE with the formats' markers added as special tokens."""
    from tokenizers import AddedToken, Tokenizer

    path = work / f"bpe-{vocab_size}-markers"
    if not (path / "tokenizer.json").exists():
        source = train_tokenizer(vocab_size, work)
        tok = Tokenizer.from_file(str(source / "tokenizer.json"))
        tok.add_special_tokens([AddedToken(m, special=True, normalized=False)
                                for m in MARKERS])
        path.mkdir(parents=True, exist_ok=True)
        tok.save(str(path / "tokenizer.json"))
        shutil.copy(source / "tokenizer_config.json", path / "tokenizer_config.json")
    return path


def measure_grammars(vocab_size: int, work: pathlib.Path, runs: int) -> list[dict]:
    from mlxcel.engine.constraints import CacheBudget, ConstraintCompiler, TokenVocabulary
    from mlxcel.engine.constraints.outlines import OutlinesBackend
    from mlxcel.lazy import resolve
    from mlxcel.model.tokenizer import Tokenizer
    from mlxcel.types.constraints import RegexConstraint, mark

    budget = CacheBudget(memory_bytes=64 << 30, disk_bytes=64 << 30, index_bytes=16 << 30,
                         compile_bytes=64 << 30)
    vocab = TokenVocabulary.from_tokenizer(Tokenizer.from_dir(marker_tokenizer(vocab_size,
                                                                               work)))
    rows = []
    for fmt, name in GRAMMARS.items():
        for n in (1, 8):
            constraint = resolve(name)(grammar_tools(n), "required")
            warm = RegexConstraint(pattern=mark(0), markers=constraint.markers)
            seconds, sizes = [], []
            for _ in range(runs):
                cache = pathlib.Path(tempfile.mkdtemp(dir=work))
                compiler = ConstraintCompiler(vocab, backend=OutlinesBackend(),
                                              cache_dir=cache, timeout=600, budget=budget)
                compiler.compile(warm)  # the marker vocabulary, built once per server
                took, compiled = timed(lambda c=compiler, k=constraint: c.compile(k))
                seconds.append(took)
                sizes.append(len(compiler.backend.dump(compiled)))
                shutil.rmtree(cache, ignore_errors=True)
            rows.append({"format": fmt, "tools": n, "vocab_size": vocab.size,
                         "pattern_kib": len(compiler.backend.regex(constraint).encode()) / 1024,
                         "states": len(compiled.index.get_transitions()),
                         "cold_ms": summary(seconds), "index_mib": max(sizes) / 2**20})
    return rows


def print_grammars(rows: list[dict], runs: int) -> None:
    print(f"| format | tools | vocab | pattern KiB | states | cold median ms ({runs} runs) "
          "| p95 ms | index MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['format']} | {r['tools']} | {r['vocab_size']} | {r['pattern_kib']:.1f} "
              f"| {r['states']} | {r['cold_ms']['median']:.1f} | {r['cold_ms']['p95']:.1f} "
              f"| {r['index_mib']:.2f} |")


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def mask_costs(compiled, size: int) -> dict[str, float]:
    """Microseconds to write one row: a state whose mask is cached, and a new state."""
    import numpy as np
    from mlxcel.engine.constraints import mask_words

    row = np.zeros(mask_words(size), np.int32)
    fresh = compiled.matcher()
    new, _ = timed(lambda: fresh.write_mask_into(row))
    n = 2000
    cached, _ = timed(lambda: [fresh.write_mask_into(row) for _ in range(n)])
    return {"new_state_us": new * 1e6, "cached_state_us": cached / n * 1e6}


def measure(vocab_size: int, work: pathlib.Path) -> dict:
    from mlxcel.engine.constraints import CacheBudget, ConstraintCompiler, TokenVocabulary
    from mlxcel.model.tokenizer import Tokenizer
    from mlxcel.types.constraints import JsonSchemaConstraint

    # room for every index, so that no run is refused or evicted
    budget = CacheBudget(memory_bytes=64 << 30, disk_bytes=64 << 30, index_bytes=16 << 30,
                         compile_bytes=64 << 30)
    tokenizer = Tokenizer.from_dir(train_tokenizer(vocab_size, work))
    build, vocab = timed(lambda: TokenVocabulary.from_tokenizer(tokenizer))
    schemas = [c["schema"] for c in json.loads(CORPUS.read_text())] + [NESTED]
    constraints = [JsonSchemaConstraint.from_schema(s) for s in schemas]
    cache = pathlib.Path(tempfile.mkdtemp(dir=work))
    cold_compiler = ConstraintCompiler(vocab, cache_dir=cache, timeout=600, budget=budget)
    cold_compiler.compile(JsonSchemaConstraint.from_schema({"type": "boolean"}))  # vocab
    cold = [timed(lambda c=c: cold_compiler.compile(c))[0] for c in constraints]
    disk_compiler = ConstraintCompiler(vocab, cache_dir=cache, budget=budget)
    disk = [timed(lambda c=c: disk_compiler.compile(c))[0] for c in constraints]
    memory = [timed(lambda c=c: disk_compiler.compile(c))[0] for c in constraints]
    assert cold_compiler.stats.compiled == len(constraints) + 1
    sizes = [f.stat().st_size / 2**20 for f in cache.rglob("*.idx")]
    assert disk_compiler.stats.disk_hits == len(constraints), disk_compiler.stats
    result = {
        "vocab_size": vocab.size, "schemas": len(constraints), "vocab_build_s": build,
        "cold_ms": summary(cold), "disk_ms": summary(disk), "memory_ms": summary(memory),
        "index_mib": {"median": statistics.median(sizes), "max": max(sizes)},
        "nested_cold_ms": cold[-1] * 1e3, "nested_disk_ms": disk[-1] * 1e3,
        "mask": mask_costs(cold_compiler.compile(constraints[-1]), vocab.size)}
    shutil.rmtree(cache, ignore_errors=True)  # the indexes can take hundreds of MiB
    return result


def summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "p95": p95(ms), "max": max(ms)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--work", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "mlxcel-constraint-probe")
    parser.add_argument("--grammars", action="store_true",
                        help="forced tool-call grammars instead of the schema corpus")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.grammars:
        rows = [r for n in args.vocab for r in measure_grammars(n, args.work, args.runs)]
        print_grammars(rows, args.runs)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    results = [measure(n, args.work) for n in args.vocab]
    print("| vocab | schemas | vocab build s | cold median / p95 ms | disk median / p95 ms "
          "| memory median ms | nested cold / disk ms | index median / max MiB "
          "| mask row new / cached us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['vocab_size']} | {r['schemas']} | {r['vocab_build_s']:.2f} "
              f"| {r['cold_ms']['median']:.1f} / {r['cold_ms']['p95']:.1f} "
              f"| {r['disk_ms']['median']:.2f} / {r['disk_ms']['p95']:.2f} "
              f"| {r['memory_ms']['median']:.3f} "
              f"| {r['nested_cold_ms']:.0f} / {r['nested_disk_ms']:.1f} "
              f"| {r['index_mib']['median']:.2f} / {r['index_mib']['max']:.0f} "
              f"| {r['mask']['new_state_us']:.0f} / {r['mask']['cached_state_us']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
