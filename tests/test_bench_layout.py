"""bench/ keeps its layout: seven harnesses, indexed probes, no sys.path imports.

A harness or probe that is not where bench/README.md and bench/probes/README.md say it is
gets lost or duplicated, so the layout is checked rather than remembered.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlxcel.testing.imports import imported_by

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TOP = {
    "README.md",
    "serving.py",
    "prompt_cache.py",
    "engine_profile.py",
    "embeddings.py",
    "vision.py",
    "audio.py",
    "speculative.py",
    "gpu",
    "probes",
    "results",
}


def _tracked(folder: Path) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [ROOT / line for line in out.stdout.splitlines() if (ROOT / line).exists()]


def test_bench_top_level_holds_the_seven_harnesses_and_four_entries():
    names = {p.relative_to(BENCH).parts[0] for p in _tracked(BENCH)}
    assert names == TOP


def test_every_probe_is_in_the_probe_index():
    index = (BENCH / "probes" / "README.md").read_text()
    probes = [p for p in _tracked(BENCH / "probes") if p.suffix in (".py", ".sh")]
    assert probes
    for p in probes:
        assert f"`{p.relative_to(BENCH / 'probes').as_posix()}`" in index, p


def test_no_bench_file_edits_sys_path():
    for p in _tracked(BENCH):
        if p.suffix in (".py", ".sh"):
            text = p.read_text()
            assert "sys.path.insert" not in text and "sys.path.append" not in text, p


def test_importing_mlxcel_testing_imports_no_mlx_numpy_or_httpx():
    assert imported_by("import mlxcel.testing, mlxcel.testing.servers",
                       ("mlx", "numpy", "httpx")) == []
