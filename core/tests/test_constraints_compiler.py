"""The constraint compiler: memory and disk caches, shared compiles, the timeout, and the
matcher rules the engine step relies on (inactive until started, masks per row)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from mlxcel.engine.constraints import (
    CacheBudget,
    ConstraintCompiler,
    TokenVocabulary,
    mask_words,
)
from mlxcel.errors import ConstraintTooComplex, Overloaded
from mlxcel.types.constraints import JsonSchemaConstraint, RegexConstraint

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"]}
@pytest.fixture(scope="module")
def checkpoint(mlxcel_checkpoint_cache):
    from mlxcel.testing.checkpoint import cached_checkpoint

    return cached_checkpoint("qwen3", cache_dir=mlxcel_checkpoint_cache, dtype="float32")


def _allowed(matcher, size: int) -> list[int]:
    row = np.zeros(mask_words(size), np.int32)
    matcher.write_mask_into(row)
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist()


FRESH_PROCESS = """
import json, pathlib, sys
from mlxcel.engine.constraints import (
    CacheBudget,
    ConstraintCompiler,
    TokenVocabulary,
    mask_words,
)
from mlxcel.engine.constraints import outlines
from mlxcel.model.tokenizer import Tokenizer
from mlxcel.types.constraints import JsonSchemaConstraint
import numpy as np

def no_compiling(*args):
    raise AssertionError("compiled again")

outlines._build_index = no_compiling
ckpt, cache, schema = sys.argv[1:]
vocab = TokenVocabulary.from_tokenizer(Tokenizer.from_dir(pathlib.Path(ckpt)))
compiler = ConstraintCompiler(vocab, cache_dir=cache)
matcher = compiler.compile(JsonSchemaConstraint(schema=schema)).matcher()
row = np.zeros(mask_words(vocab.size), np.int32)
matcher.write_mask_into(row)
print(json.dumps({"disk_hits": compiler.stats.disk_hits, "compiled": compiler.stats.compiled,
                  "mask": row.tolist()}))
"""


def test_a_fresh_process_loads_the_index_from_disk_without_compiling(tmp_path, checkpoint,
                                                                      vocabulary):
    constraint = JsonSchemaConstraint.from_schema(SCHEMA)
    first = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    matcher = first.compile(constraint).matcher()
    assert first.stats.compiled == 1 and len(list(tmp_path.rglob("*.idx"))) == 1
    row = np.zeros(mask_words(vocabulary.size), np.int32)
    matcher.write_mask_into(row)
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(checkpoint), str(tmp_path),
                           constraint.schema], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert (seen["disk_hits"], seen["compiled"]) == (1, 0)
    assert seen["mask"] == row.tolist() and any(seen["mask"])


@pytest.mark.parametrize("kind", ["schema", "regex"])
def test_a_fresh_compiler_object_reads_the_disk_and_the_same_one_reads_memory(tmp_path,
                                                                             vocabulary, kind):
    constraint = JsonSchemaConstraint.from_schema(SCHEMA) if kind == "schema" \
        else RegexConstraint(pattern="(?:get|set)_[a-z]{1,6}:[0-9]{1,3}")
    ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(constraint)
    again = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    first = again.compile(constraint)
    assert again.compile(constraint) is first
    assert (again.stats.compiled, again.stats.disk_hits, again.stats.memory_hits) == (0, 1, 1)


def test_another_tokenizer_or_schema_is_another_key(tmp_path, vocabulary):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    compiler.compile(JsonSchemaConstraint.from_schema(SCHEMA))
    compiler.compile(JsonSchemaConstraint.from_schema({**SCHEMA, "required": ["n"]}))
    other = TokenVocabulary(tokens={i: b for i, b in vocabulary.tokens.items() if i != 300},
                            eos_ids=vocabulary.eos_ids, size=vocabulary.size,
                            fingerprint=vocabulary.fingerprint + "-other")
    ConstraintCompiler(other, cache_dir=tmp_path).compile(JsonSchemaConstraint.from_schema(SCHEMA))
    assert len(list(tmp_path.rglob("*.idx"))) == 3


def test_a_damaged_cache_file_is_compiled_again_and_replaced(tmp_path, vocabulary):
    constraint = JsonSchemaConstraint.from_schema(SCHEMA)
    ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(constraint)
    (path,) = tmp_path.rglob("*.idx")
    path.write_bytes(b"not an index")
    fresh = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    fresh.compile(constraint)
    assert fresh.stats.compiled == 1 and path.read_bytes() != b"not an index"


def test_the_disk_keeps_what_fits_its_byte_budget_newest_first(tmp_path, vocabulary):
    probe = ConstraintCompiler(vocabulary, cache_dir=tmp_path / "probe")
    probe.compile(JsonSchemaConstraint.from_schema({"enum": [10]}))
    (one,) = (tmp_path / "probe").rglob("*.idx")
    budget = CacheBudget(disk_bytes=one.stat().st_size * 5 // 2)
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path / "kept", budget=budget)
    for n in (11, 12, 13):
        compiler.compile(JsonSchemaConstraint.from_schema({"enum": [n]}))
        time.sleep(0.01)  # distinct modification times
    assert len(list((tmp_path / "kept").rglob("*.idx"))) == 2
    fresh = ConstraintCompiler(vocabulary, cache_dir=tmp_path / "kept")
    fresh.compile(JsonSchemaConstraint.from_schema({"enum": [13]}))
    fresh.compile(JsonSchemaConstraint.from_schema({"enum": [11]}))
    assert (fresh.stats.disk_hits, fresh.stats.compiled) == (1, 1), "the oldest went"


def test_memory_keeps_what_fits_its_byte_budget(tmp_path, vocabulary):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path, budget=CacheBudget(
        memory_bytes=1))
    constraint = JsonSchemaConstraint.from_schema(SCHEMA)
    compiler.compile(constraint)
    compiler.compile(constraint)
    assert (compiler.stats.memory_hits, compiler.stats.disk_hits) == (0, 1)


def test_an_index_over_the_budget_is_refused_and_not_kept(tmp_path, vocabulary):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path, budget=CacheBudget(
        index_bytes=1 << 20))
    long_string = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 800}}}
    with pytest.raises(ConstraintTooComplex, match="more than 1 MiB") as caught:
        compiler.compile(JsonSchemaConstraint.from_schema(long_string))
    assert caught.value.status == 400 and not list(tmp_path.rglob("*.idx"))


def test_equal_requests_in_flight_share_one_compile(tmp_path, vocabulary):
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    constraint = JsonSchemaConstraint.from_schema({**SCHEMA, "title": "shared"})
    futures = [compiler.submit(constraint) for _ in range(4)]
    results = {id(f.result(timeout=60)) for f in futures}
    assert len(results) == 1 and compiler.stats.compiled == 1


# passes every check (each count is under the bound) but builds without end: 24 optional
# strings of up to 1024 characters
BOMB = {"type": "object", "properties": {
    f"p{i}": {"type": "string", "maxLength": 1024} for i in range(24)}}


def test_a_timed_out_build_is_killed_and_frees_its_slot_while_others_run(tmp_path,
                                                                       vocabulary):
    """Issue #27 M1/H1: the build runs in a worker process that is killed at the timeout
    (nothing lands, nothing keeps allocating), its slot is free at once, and a thread
    standing for the engine keeps running meanwhile (the build holds no GIL of ours)."""
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path, timeout=1.0, workers=1)
    compiler.compile(JsonSchemaConstraint.from_schema({"type": "integer"}))  # warm worker
    ticks, stop = [0], threading.Event()

    def stream() -> None:  # stands for the engine thread decoding other rows
        while not stop.is_set():
            ticks[0] += 1

    other = threading.Thread(target=stream)
    other.start()
    started = time.monotonic()
    future = compiler.submit(JsonSchemaConstraint.from_schema(BOMB))
    with pytest.raises(ConstraintTooComplex, match="did not compile within 1 s") as caught:
        future.result(timeout=30)
    waited, during = time.monotonic() - started, ticks[0]
    stop.set()
    other.join()
    assert caught.value.status == 400 and "p23" not in caught.value.message
    assert waited < 10 and during > 100_000 and compiler.stats.timeouts == 1
    assert compiler.stats.compiled == 1 and len(list(tmp_path.rglob("*.idx"))) == 1
    started = time.monotonic()
    assert compiler.compile(JsonSchemaConstraint.from_schema({"type": "boolean"})) is not None
    assert time.monotonic() - started < 10, "the one slot was free again"


def test_a_full_queue_is_overloaded_not_the_schemas_fault(tmp_path, vocabulary):
    """Issue #27 M1: past the slots and the queue, a compile gets 503 Overloaded."""
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path, timeout=1.5, workers=1,
                                  queue=1)
    compiler.compile(JsonSchemaConstraint.from_schema({"type": "integer"}))  # warm worker
    slow = compiler.submit(JsonSchemaConstraint.from_schema(BOMB))
    time.sleep(0.2)
    queued = compiler.submit(JsonSchemaConstraint.from_schema({"type": "string",
                                                               "maxLength": 3}))
    time.sleep(0.2)
    with pytest.raises(Overloaded, match="try again") as caught:
        compiler.compile(JsonSchemaConstraint.from_schema({"type": "null"}))
    assert caught.value.status == 503
    with pytest.raises(ConstraintTooComplex):
        slow.result(timeout=30)
    assert queued.result(timeout=30) is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="RLIMIT_AS is enforced on Linux only")
def test_a_build_past_the_memory_cap_fails_fast_and_the_next_one_compiles(tmp_path,
                                                                        vocabulary):
    """Issue #27 H1: the worker's address space is capped; a build that passes it dies
    (a 400 that blames the schema), and a new worker takes the next compile."""
    budget = CacheBudget(compile_bytes=400 << 20)
    compiler = ConstraintCompiler(vocabulary, cache_dir=tmp_path, timeout=30, workers=1,
                                  budget=budget)
    started = time.monotonic()
    with pytest.raises(ConstraintTooComplex, match="more memory") as caught:
        compiler.compile(JsonSchemaConstraint.from_schema(BOMB))
    assert caught.value.status == 400 and time.monotonic() - started < 20
    assert compiler.compile(JsonSchemaConstraint.from_schema(SCHEMA)) is not None


def test_a_timeout_must_be_positive(vocabulary):
    with pytest.raises(ValueError):
        ConstraintCompiler(vocabulary, timeout=0)


def test_an_inactive_matcher_allows_everything_until_started(tmp_path, vocabulary):
    compiled = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(
        JsonSchemaConstraint.from_schema(SCHEMA))
    matcher = compiled.matcher(active=False)
    row = np.zeros(mask_words(vocabulary.size) + 2, np.int32)
    matcher.write_mask_into(row)
    assert (row == -1).all() and not matcher.accepting
    assert matcher.advance(5) and matcher.advance(next(iter(vocabulary.eos_ids)))
    assert not matcher.finished
    matcher.start()
    assert matcher.active and _allowed(matcher, vocabulary.size) == \
        _allowed(compiled.matcher(), vocabulary.size)


def test_rows_of_one_schema_advance_independently(tmp_path, vocabulary):
    compiled = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(
        JsonSchemaConstraint.from_schema(SCHEMA))
    a, b = compiled.matcher(), compiled.matcher()
    brace = next(t for t, raw in vocabulary.tokens.items() if raw == b"{")
    before = _allowed(b, vocabulary.size)
    assert brace in before and a.advance(brace)
    assert _allowed(b, vocabulary.size) == before != _allowed(a, vocabulary.size)
    assert not a.advance(brace), "a token the mask refuses is refused"


def test_a_mask_row_narrower_than_the_vocabulary_is_an_error(tmp_path, vocabulary):
    matcher = ConstraintCompiler(vocabulary, cache_dir=tmp_path).compile(
        JsonSchemaConstraint.from_schema(SCHEMA)).matcher()
    with pytest.raises(ValueError):
        matcher.write_mask_into(np.zeros(mask_words(vocabulary.size) - 1, np.int32))


def test_a_cache_file_copied_over_another_schemas_is_not_served_for_it(tmp_path, vocabulary):
    """Issue #27 M6: each file holds its own key (constraint hash, vocabulary
    fingerprint), checked on read; a file put in another's place is a miss."""
    one = JsonSchemaConstraint.from_schema({"enum": ["one"]})
    two = JsonSchemaConstraint.from_schema({"enum": ["two"]})
    first = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    first.compile(one)
    (path_one,) = tmp_path.rglob("*.idx")
    first.compile(two)
    (path_two,) = set(tmp_path.rglob("*.idx")) - {path_one}
    assert path_one.read_bytes().startswith(b"mlxcel-constraint-index 1\n")
    path_two.write_bytes(path_one.read_bytes())
    fresh = ConstraintCompiler(vocabulary, cache_dir=tmp_path)
    matcher = fresh.compile(two).matcher()
    assert (fresh.stats.disk_hits, fresh.stats.compiled) == (0, 1)
    assert all(matcher.advance(t) for t in vocabulary_ids(vocabulary, '"two"'))
    fresh.compile(one)
    assert fresh.stats.disk_hits == 1, "the untouched file is still served"


def vocabulary_ids(vocabulary, text: str) -> list[int]:
    """Single-byte tokens spelling ``text`` (the tiny vocabulary has every ASCII byte)."""
    by_bytes = {raw: token for token, raw in vocabulary.tokens.items()}
    return [by_bytes[ch.encode()] for ch in text]


def test_pools_beyond_the_bound_stop_their_workers(vocabulary):
    """Worker processes are per vocabulary; past ``POOLS`` vocabularies the least recently
    used pool's idle workers are stopped, so a process that saw many tokenizers (a test
    suite) does not keep two processes for each."""
    import dataclasses

    from mlxcel.engine.constraints import OutlinesBackend
    from mlxcel.engine.constraints.workers import POOLS, pool_for

    backend = OutlinesBackend()
    vocabs = [dataclasses.replace(vocabulary, fingerprint=f"pool-test-{i}")
              for i in range(POOLS + 1)]
    first = pool_for(backend, vocabs[0], size=1, memory_bytes=1 << 30, queue_size=1)
    first.compile(JsonSchemaConstraint.from_schema({"type": "integer"}), 30)
    (worker,) = first._workers
    for vocab in vocabs[1:]:
        pool_for(backend, vocab, size=1, memory_bytes=1 << 30, queue_size=1)
    assert first.closed and not worker.alive and first._workers == [None]
    assert pool_for(backend, vocabs[0], size=1, memory_bytes=1 << 30,
                    queue_size=1) is not first
