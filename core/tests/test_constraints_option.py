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
