"""The constraint compiler's option rows and their env twins: the compile timeout, and the
directory compiled indexes persist in."""

from __future__ import annotations

from apphelpers import make_client, wait_ready


def test_the_option_and_its_env_twin(monkeypatch):
    from mlxcel.options import build_parser

    monkeypatch.delenv("MLXCEL_GRAMMAR_COMPILE_TIMEOUT", raising=False)
    assert build_parser().parse_args([]).grammar_compile_timeout == 60.0
    assert build_parser().parse_args(["--grammar-compile-timeout", "5"]) \
        .grammar_compile_timeout == 5.0
    monkeypatch.setenv("MLXCEL_GRAMMAR_COMPILE_TIMEOUT", "2.5")
    assert build_parser().parse_args([]).grammar_compile_timeout == 2.5


def test_compiled_schemas_persist_in_the_grammar_cache_dir(tiny_checkpoint, tmp_path,
                                                           monkeypatch):
    from mlxcel.options import build_parser

    monkeypatch.delenv("MLXCEL_GRAMMAR_CACHE_DIR", raising=False)
    assert build_parser().parse_args([]).grammar_cache_dir is None
    monkeypatch.setenv("MLXCEL_GRAMMAR_CACHE_DIR", str(tmp_path / "env"))
    assert build_parser().parse_args([]).grammar_cache_dir == str(tmp_path / "env")

    where = tmp_path / "grammars"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {"model": "tiny", "max_tokens": 24, "messages": [{"role": "user", "content": "n?"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": schema}}}
    with make_client(tiny_checkpoint, grammar_cache_dir=str(where)) as client:
        wait_ready(client)
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    stored = list(where.rglob("*.idx"))
    assert len(stored) == 1 and stored[0].stat().st_size > 0


def test_the_cache_budgets_are_flags_with_env_twins_and_reach_the_compiler(
        tiny_checkpoint, tmp_path, monkeypatch):
    """Issue #27 M6: the memory and disk budgets (and the compile worker's memory cap)
    were fixed at 2 GiB / 8 GiB; they are options now, with smaller defaults."""
    from mlxcel.options import build_parser

    for name in ("RAM", "DISK"):
        monkeypatch.delenv(f"MLXCEL_GRAMMAR_CACHE_{name}", raising=False)
    monkeypatch.delenv("MLXCEL_GRAMMAR_COMPILE_MEMORY", raising=False)
    parsed = build_parser().parse_args([])
    assert (parsed.grammar_cache_ram, parsed.grammar_cache_disk,
            parsed.grammar_compile_memory) == (1 << 30, 2 << 30, 4 << 30)
    parsed = build_parser().parse_args(["--grammar-cache-ram", "64M"])
    assert parsed.grammar_cache_ram == 64 << 20
    monkeypatch.setenv("MLXCEL_GRAMMAR_CACHE_DISK", "3M")
    monkeypatch.setenv("MLXCEL_GRAMMAR_COMPILE_MEMORY", "3G")
    parsed = build_parser().parse_args([])
    assert (parsed.grammar_cache_disk, parsed.grammar_compile_memory) == (3 << 20, 3 << 30)

    with make_client(tiny_checkpoint, grammar_cache_dir=str(tmp_path), grammar_cache_ram=5,
                     grammar_cache_disk=7 << 20, grammar_compile_memory=3 << 30) as client:
        wait_ready(client)
        budget = client.app.state["ctx"].constraint_compiler().budget
    assert (budget.memory_bytes, budget.disk_bytes, budget.compile_bytes) == \
        (5, 7 << 20, 3 << 30)
