"""The compile timeout's option row and its env twin."""

from __future__ import annotations


def test_the_option_and_its_env_twin(monkeypatch):
    from mlxcel.options import build_parser

    monkeypatch.delenv("MLXCEL_GRAMMAR_COMPILE_TIMEOUT", raising=False)
    assert build_parser().parse_args([]).grammar_compile_timeout == 60.0
    assert build_parser().parse_args(["--grammar-compile-timeout", "5"]) \
        .grammar_compile_timeout == 5.0
    monkeypatch.setenv("MLXCEL_GRAMMAR_COMPILE_TIMEOUT", "2.5")
    assert build_parser().parse_args([]).grammar_compile_timeout == 2.5
