"""Meta-tests: every distribution folder is a package that CI tests in an env of its own.

A distribution folder is ``families/<name>`` (distribution ``mlxcel-family-<name>``, entry
point and tox env ``family-<name>``), ``plugins/<kind>-<name>`` (``mlxcel-<kind>-<name>``,
entry point and env ``<kind>-<name>``) or ``docs/examples/<name>`` (a third party's package:
any distribution name, entry point ``<name>``, env ``example-<name>``). Each has tests with a
conformance test, and a tox env holding core plus itself only, so a dependency it forgot to
declare fails in CI rather than on a user's machine.
"""

from __future__ import annotations

import configparser
import os
import pathlib
import re
import subprocess
import sys

import tomllib  # Python 3.11+; the test machines have it

ROOT = pathlib.Path(__file__).resolve().parents[2]
# folder kind -> (tox env, entry point, distribution name or None: the third party's choice)
KINDS = {
    "families": ("family-{}", "family-{}", "mlxcel-family-{}"),
    "plugins": ("{}", "{}", "mlxcel-{}"),
    "docs/examples": ("example-{}", "{}", None),
}
ALWAYS = ("core", "lint", "integration")


def _distributions() -> list[tuple[pathlib.Path, str, str, str | None]]:
    """(folder, tox env, entry point, distribution) for every distribution folder."""
    out = []
    for kind, (env, point, dist) in KINDS.items():
        for folder in sorted((ROOT / kind).iterdir()):
            if folder.is_dir() and not folder.name.startswith((".", "_")):
                name = folder.name
                out.append((folder, env.format(name), point.format(name),
                            dist and dist.format(name)))
    return out


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


def _local_paths(deps: str) -> set[str]:
    """The repository folders a tox env installs (``-e ./core`` -> ``core``; an extra,
    ``./families/gemma4[vision]``, is the folder's)."""
    return {m.rstrip("/").split("[")[0]
            for m in re.findall(r"^\s*-e\s+\./(\S+)", deps, re.M)}


def _needed(folder: pathlib.Path) -> set[str]:
    """The repository's distributions that ``folder``'s own requirements name (an extra's
    included: ``mlxcel-family-gemma4[vision]`` needs ``mlxcel-family-vlm``)."""
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    wanted = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        wanted += group
    names = {re.split(r"[\s\[<>=;!~]", w, maxsplit=1)[0].lower() for w in wanted}
    return {other.relative_to(ROOT).as_posix() for other, _, _, dist in _distributions()
            if dist is not None and dist.lower() in names}


def test_there_is_a_distribution_folder_to_check():
    """The example package is one, so these checks never pass over an empty set."""
    assert any(env == "example-toolcall-acme" for _, env, _, _ in _distributions())


def test_every_distribution_folder_is_a_package_with_its_entry_point():
    for folder, _, point, dist in _distributions():
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        if dist is not None:
            assert project["name"] == dist, f"{folder}: distribution {project['name']!r}"
        points = project.get("entry-points", {}).get("mlxcel", {})
        assert point in points, f"{folder}: no entry point {point!r} in group mlxcel"
        module = points[point].partition(":")[0].replace(".", "/")
        assert (folder / "src" / f"{module}.py").is_file() \
            or (folder / "src" / module / "__init__.py").is_file(), \
            f"{folder}: entry point {point} names {points[point]}, which src/ lacks"
        assert (folder / "README.md").is_file(), f"{folder} has no README.md"


def test_every_distribution_has_a_conformance_test():
    for folder, _, _, _ in _distributions():
        tests = list((folder / "tests").glob("test_*conformance*.py"))
        assert tests, f"{folder}/tests has no test_*conformance*.py"
        assert any("mlxcel.testing.conformance" in t.read_text() for t in tests), \
            f"{folder}: its conformance test calls no runner of mlxcel.testing.conformance"


def test_every_distribution_has_a_tox_env_with_core_and_itself_only():
    tox = _tox()
    for folder, env, _, _ in _distributions():
        section = f"testenv:{env}"
        assert section in tox, f"tox.ini has no env {env} for {folder}"
        rel = folder.relative_to(ROOT).as_posix()
        allowed = {"core", rel} | _needed(folder)
        assert _local_paths(tox[section]["deps"]) == allowed, \
            f"tox env {env} must install ./core, ./{rel} and what it needs " \
            f"({sorted(allowed)}), and no other distribution"
        assert f" {rel}/tests" in tox[section]["commands"], f"tox env {env} runs no {rel}/tests"


def test_integration_installs_every_family_and_plugin_together():
    """Installed side by side, distributions must not clash (a duplicate name or
    model_type fails start-up), so the cross-distribution env holds all of them."""
    wanted = {"core"} | {folder.relative_to(ROOT).as_posix() for folder, *_ in _distributions()
                         if not folder.is_relative_to(ROOT / "docs")}
    assert _local_paths(_tox()["testenv:integration"]["deps"]) == wanted


def test_tox_lists_core_every_distribution_lint_and_integration():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOX_")}
    proc = subprocess.run([sys.executable, "-m", "tox", "-l"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split()
    wanted = [*ALWAYS, *(e for _, e, _, _ in _distributions())]
    assert sorted(listed) == sorted(wanted), f"tox -l gives {listed}; the folders want {wanted}"
