"""One configuration path: every mlxcel setting is a row of the options table (flag, env
twin, help), resolved once into Settings; only the options and settings code reads the
environment, and docs/reference/env.md lists every twin.

``python tests/test_config_path.py`` rewrites env.md's table of twins from the options table.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlxcel.engine.config import EngineConfig
from mlxcel.options import OPTIONS, build_parser
from mlxcel.settings import Settings
from mlxcel.testing.e2e import GeneratedBlock

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "core" / "src" / "mlxcel"
ENV_MD = ROOT / "docs" / "reference" / "env.md"
TWINS = {env: row.flags for row in OPTIONS for env in (row.env, row.env_also) if env}
# variables of mlxcel's that are plumbing or test kit, not settings (docs/reference/env.md)
INTERNAL = {
    "MLXCEL_SETTINGS_JSON": "the CLI hands its Settings to the Granian worker",
    "MLXCEL_FAILURE_FILE": "the worker hands a fatal error back to the CLI",
    "MLXCEL_FAST_BLAS_REEXEC": "the re-executed server never re-executes again",
    "MLXCEL_CACHE_DIR": "where mlxcel.testing (the pytest plugin, --demo) builds checkpoints",
}
# module -> the functions in it that may read os.environ (None: any, for the test kit)
ENV_READERS: dict[str, set[str] | None] = {
    "options.py": {"_env_default"},  # the env twins of the table
    # CLI -> worker plumbing, and library_env: LD_PRELOAD, OpenBLAS's threads (other
    # programs' own variables)
    "settings.py": {"from_env", "failure_file", "hand_to_worker"},
    "backend.py": {"library_env"},  # LD_PRELOAD, OpenBLAS's threads: other programs' own
    "testing/pytest_plugin.py": None,
    "testing/checkpoint.py": None,
    "testing/servers.py": None,  # the benchmarks' startup timeout (bench/gpu/run.sh sets it)
    "testing/distributed.py": None,  # the ranks it starts inherit the test's environment
}
_NAME = re.compile(r"\b(?:MLXCEL|LLAMA_ARG)_[A-Z0-9_]*[A-Z0-9]\b")
_BEGIN = ("<!-- env twins: generated from mlxcel.options.OPTIONS by "
          "`python tests/test_config_path.py` -->")
_END = "<!-- end env twins -->"


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _env_reads(path: Path) -> list[str]:
    """The functions of ``path`` that touch ``os.environ`` / ``os.getenv`` ("<module>"
    for module level); ``from os import environ`` counts at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else where
            if isinstance(child, ast.Attribute) and child.attr in ("environ", "getenv", "putenv") \
                    and isinstance(child.value, ast.Name) and child.value.id == "os":
                found.append(where)
            if isinstance(child, ast.ImportFrom) and child.module == "os" and any(
                    a.name in ("environ", "getenv", "putenv") for a in child.names):
                found.append(where)
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_every_mlxcel_variable_named_in_the_code_is_an_env_twin_or_internal():
    unknown = {}
    for path in _modules():
        for name in _NAME.findall(path.read_text(encoding="utf-8")):
            if name not in TWINS and name not in INTERNAL:
                unknown.setdefault(name, str(path.relative_to(SRC)))
    assert unknown == {}, "add a row to mlxcel.options.OPTIONS for each of these"


def test_only_the_options_and_settings_code_reads_the_environment():
    strays = {}
    for path in _modules():
        rel = path.relative_to(SRC).as_posix()
        allowed = ENV_READERS.get(rel, set())
        bad = [f for f in _env_reads(path) if allowed is not None and f not in allowed]
        if bad:
            strays[rel] = bad
    assert strays == {}, "take the value from Settings (mlxcel.options), not os.environ"


def test_every_allowed_reader_still_reads_the_environment():
    """An allow-list entry goes once its module stops reading the environment."""
    for rel, allowed in ENV_READERS.items():
        if allowed is not None:
            assert set(_env_reads(SRC / rel)) == allowed, rel


def twin_table() -> str:
    rows = [f"| `{env}` | {', '.join(f'`{f}`' for f in row.flags)} |"
            for row in OPTIONS for env in (row.env, row.env_also) if env]
    return "\n".join(["| variable | flag |", "|---|---|", *rows])


TWIN_TABLE = GeneratedBlock(ENV_MD, _BEGIN, _END, twin_table, "tests/test_config_path.py")


def test_env_md_lists_every_twin_of_the_options_table():
    text = TWIN_TABLE.check()
    for name in (*TWINS, *INTERNAL):
        assert f"`{name}`" in text, name


KNOBS = [  # (flag, env twin, a good value, what Settings holds for it, a bad value)
    ("--request-memory-budget", "MLXCEL_REQUEST_MEMORY_BUDGET", "512M", 512 << 20, "0"),
    ("--switch-interval", "MLXCEL_SWITCH_INTERVAL", "0.0007", 0.0007, "2"),
    ("--fuse-projections", "MLXCEL_FUSE_PROJECTIONS", "0", False, "sometimes"),
    ("--decode-attention", "MLXCEL_DECODE_ATTENTION", "Grouped", "grouped", "fast"),
    ("--shared-positions", "MLXCEL_SHARED_POSITIONS", "off", False, "maybe"),
    ("--engine-trace", "MLXCEL_ENGINE_TRACE", " /tmp/t.jsonl ", "/tmp/t.jsonl", None),
    ("--dtype", "MLXCEL_DTYPE", "float16", "float16", "float64"),
]


def _settings(argv: list[str]) -> Settings:
    return Settings(**vars(build_parser().parse_args(argv)))


@pytest.mark.parametrize("flag,env,raw,value,bad", KNOBS)
def test_a_knob_reads_the_same_from_its_flag_and_its_env_twin(monkeypatch, flag, env, raw,
                                                               value, bad):
    from mlxcel.errors import StartupError

    monkeypatch.delenv(env, raising=False)
    dest = flag[2:].replace("-", "_")
    assert getattr(_settings([flag, raw]), dest) == value
    monkeypatch.setenv(env, raw)
    assert getattr(_settings([]), dest) == value
    if bad is not None:
        monkeypatch.setenv(env, bad)
        with pytest.raises(StartupError, match=env):
            build_parser()
        monkeypatch.delenv(env)
        with pytest.raises(SystemExit):
            build_parser().parse_args([flag, bad])


def test_loop_detection_resolves_to_a_policy_and_travels_to_the_worker(monkeypatch):
    from mlxcel.types import LoopPolicy

    monkeypatch.setenv("MLXCEL_LOOP_DETECTION", "2:6:3")
    settings = _settings([])
    assert settings.loop_detection == LoopPolicy(min_pattern_size=2, max_pattern_size=6,
                                                 min_count=3)
    assert not _settings(["--loop-detection", "off"]).loop_detection.enabled
    monkeypatch.setenv("MLXCEL_SETTINGS_JSON", settings.to_env())
    assert Settings.from_env() == settings


def test_nothing_set_means_the_engines_own_defaults(monkeypatch):
    for row in OPTIONS:
        if row.env:
            monkeypatch.delenv(row.env, raising=False)
    settings = _settings([])
    assert settings == Settings()
    assert EngineConfig.from_settings(settings) == EngineConfig()
    tuned = _settings(["--switch-interval", "0.001", "--engine-trace", "/tmp/x"])
    assert EngineConfig.from_settings(tuned) == EngineConfig(switch_interval=0.001,
                                                             engine_trace="/tmp/x")


def test_the_engine_takes_its_settings_from_its_config(tiny_checkpoint):
    from mlxcel.testing.engine import worker_for

    def worker(**config):
        return worker_for(tiny_checkpoint, parallel=2, config=EngineConfig(**config))

    default = worker()
    assert default.rope is not None and default.trace.enabled is False
    tuned = worker(shared_positions=False, request_memory_budget=1 << 20)
    assert tuned.rope is None and tuned.memory_budget == 1 << 20
    assert default.memory_budget > tuned.memory_budget


def test_the_cli_refuses_a_bad_knob_without_importing_the_engine():
    code = ("import sys; from mlxcel.cli import main; rc = main(['--model', 'x']); "
            "print(rc, sorted(m for m in sys.modules if m.startswith(('mlxcel.engine', "
            "'mlx.'))))")
    env = {**os.environ, "MLXCEL_SWITCH_INTERVAL": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "2 []"
    assert "MLXCEL_SWITCH_INTERVAL" in proc.stderr


if __name__ == "__main__":
    TWIN_TABLE.write()


def test_step_order_resolves_into_the_engine_policy(monkeypatch):
    from mlxcel.engine.policy import resolve_policy

    assert resolve_policy(EngineConfig()).emit_first is False  # the CPU's own order
    monkeypatch.setenv("MLXCEL_STEP_ORDER", "emit-first")
    config = EngineConfig.from_settings(_settings([]))
    assert config.step_order == "emit-first" and resolve_policy(config).emit_first is True
    config = EngineConfig.from_settings(_settings(["--step-order", "queue-first"]))
    assert resolve_policy(config).emit_first is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--step-order", "sideways"])
