"""Docs stay in step with the code: every flag and env twin is documented."""

from __future__ import annotations

from pathlib import Path

from mlxcel.cli import OPTIONS

ROOT = Path(__file__).resolve().parents[1]


def test_every_flag_and_env_twin_is_documented():
    flags_md = (ROOT / "docs" / "reference" / "flags.md").read_text()
    for row in OPTIONS:
        for flag in row.flags:
            assert f"`{flag}`" in flags_md, flag
        assert row.env is None or f"`{row.env}`" in flags_md, row.env
    assert "`--demo`" in flags_md and "`MLXCEL_DEMO`" in flags_md


def test_readme_gives_the_two_setup_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "make serve" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_says_how_to_run_one_distributions_tests():
    readme = (ROOT / "README.md").read_text()
    assert "tox -e family-<name>" in readme and "tox -l" in readme


def test_the_docs_index_links_every_tutorial_and_how_to_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted((ROOT / "docs").glob("tutorial/*.md")) + sorted(
        (ROOT / "docs").glob("howto/*.md"))
    assert len(pages) >= 3
    for page in pages:
        assert f"]({page.relative_to(ROOT / 'docs').as_posix()})" in index, page.name


def test_the_selecting_plugins_how_to_names_the_real_flags_and_env_twins():
    howto = (ROOT / "docs" / "howto" / "selecting-plugins.md").read_text()
    rows = {row.dest: (row.flags, row.env) for row in OPTIONS}
    for dest in ("plugins", "disable_plugins", "tool_call_format"):
        flags, env = rows[dest]
        assert f"`{flags[0]}" in howto and f"`{env}`" in howto, dest


def test_the_distributed_how_to_names_the_real_flags_and_the_launch_subcommand():
    howto = (ROOT / "docs" / "howto" / "distributed.md").read_text()
    flags = {flag for row in OPTIONS for flag in row.flags}
    for flag in ("--distributed", "--distributed-timeout"):
        assert flag in flags and f"`{flag}" in howto, flag
    assert "mlxcel-server launch --hostfile" in howto and "--backend nccl" in howto
