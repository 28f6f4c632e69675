"""Docs stay in step with the code: every flag and env twin is documented."""

from __future__ import annotations

from pathlib import Path

from mlxcel.cli import OPTIONS

ROOT = Path(__file__).resolve().parents[1]


def test_every_flag_and_env_twin_is_documented():
    flags_md = (ROOT / "docs" / "reference" / "flags.md").read_text()
    for flags, _dest, _type, _default, env, _help in OPTIONS:
        for flag in flags:
            assert f"`{flag}`" in flags_md, flag
        assert f"`{env}`" in flags_md, env
    assert "`--demo`" in flags_md and "`MLXCEL_DEMO`" in flags_md


def test_readme_gives_the_two_setup_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "make serve" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
