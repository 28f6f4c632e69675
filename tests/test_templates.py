"""The distribution template works as it stands: instantiated under a new name, built and
installed, its entry point loads, registers its tool format, and its own conformance test
passes against the installed package."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# templates/ is a folder of files, not a package: load its script by path
_spec = importlib.util.spec_from_file_location("instantiate", ROOT / "templates/instantiate.py")
instantiate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(instantiate)

pytestmark = pytest.mark.slow


def test_names_follow_the_repository_rule():
    assert instantiate.names(Path("plugins/toolcall-foo")) == {
        "dist": "mlxcel-toolcall-foo", "package": "mlxcel_toolcall_foo",
        "entry_point": "toolcall-foo", "tool_format": "foo"}
    assert instantiate.names(Path("families/gemma4")) == {
        "dist": "mlxcel-family-gemma4", "package": "mlxcel_family_gemma4",
        "entry_point": "family-gemma4", "tool_format": "gemma4"}
    assert instantiate.names(Path("x/acme"), dist="acme-plugin", entry_point="toolcall-acme") \
        == {"dist": "acme-plugin", "package": "acme_plugin", "entry_point": "toolcall-acme",
            "tool_format": "acme"}


def test_an_existing_folder_is_never_overwritten(tmp_path):
    with pytest.raises(FileExistsError):
        instantiate.instantiate(tmp_path, instantiate.names(tmp_path))


def _install(src: Path, target: Path) -> None:
    uv = Path(sys.executable).with_name("uv")
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv")
    cmd = ([uv_cmd, "pip", "install", "--python", sys.executable] if uv_cmd
           else [sys.executable, "-m", "pip", "install", "--quiet"])
    proc = subprocess.run([*cmd, "--no-deps", "--target", str(target), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"could not install {src}:\n{proc.stdout}\n{proc.stderr}"


def test_an_instantiated_template_installs_loads_and_conforms(tmp_path):
    dest = tmp_path / "plugins" / "toolcall-skeleton"
    written = instantiate.main([str(dest)]) == 0 and sorted(
        p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert written == ["README.md", "pyproject.toml", "src/mlxcel_toolcall_skeleton/__init__.py",
                       "src/mlxcel_toolcall_skeleton/parser.py",
                       "src/mlxcel_toolcall_skeleton/plugin.py", "tests/test_conformance.py"]
    for path in dest.rglob("*.*"):
        for key in instantiate.PLACEHOLDERS:
            assert f"{{{{{key}}}}}" not in path.read_text(), f"{path} keeps {{{{{key}}}}}"
    _install(dest, tmp_path / "site")
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("MLXCEL_PLUGINS", "MLXCEL_DISABLE_PLUGINS")},
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"),
                                                        os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "mlxcel.cli", "plugins", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = {i["name"]: i for i in json.loads(proc.stdout)}["toolcall-skeleton"]
    assert info["status"] == "loaded", info
    assert info["distribution"] == "mlxcel-toolcall-skeleton" and info["version"] == "0.1.0"
    assert info["registers"] == {"tool formats": ["skeleton"]}
    # its own conformance test, run from its folder against the installed package
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests"], cwd=dest, capture_output=True, text=True, env=env,
                           timeout=300)
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr
