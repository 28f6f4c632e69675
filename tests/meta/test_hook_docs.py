"""Meta-tests: every hook is documented (its section, its struct's every field, its
docstring's call) and exercised by a plugin that some test registers."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import msgspec
from mlxcel import hookspecs

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOKS_MD = (ROOT / "docs/reference/hooks.md").read_text()


def _hooks() -> list[str]:
    return [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
            if name.startswith("mlxcel_")]


def _section(hook: str) -> str:
    start = HOOKS_MD.index(f"### `{hook}`")
    nxt = HOOKS_MD.find("\n### ", start + 1)
    return HOOKS_MD[start:nxt if nxt > 0 else None]


def _struct(hook: str) -> type[msgspec.Struct]:
    row = re.search(rf"^\| `{hook}` \| `([\w.]+)` \| `([\w.]+)` \|", HOOKS_MD, re.M)
    assert row, f"{hook} has no row in the hooks table"
    module, _, name = f"mlxcel.{row.group(2)}".rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_hook_has_a_table_row_and_a_section_listing_its_fields():
    assert set(_hooks()) == set(hookspecs.REGISTRY_HOOKS)
    for hook in _hooks():
        struct = _struct(hook)
        section = _section(hook)
        assert f"`{struct.__name__}`" in section.splitlines()[0]
        for field in struct.__struct_fields__:
            assert f"| `{field}` |" in section, f"{struct.__name__}.{field} is undocumented"
        documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
        assert documented <= set(struct.__struct_fields__), documented - set(
            struct.__struct_fields__)


def test_every_hookspec_docstring_shows_its_call():
    for hook in _hooks():
        doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
        assert f"registry.add({_struct(hook).__name__}(" in doc, hook


def test_every_hook_is_implemented_by_a_plugin_some_test_registers():
    sources = [p.read_text() for d in ("core/tests", "tests", "core/src/mlxcel")
               for p in (ROOT / d).rglob("*.py") if "hookspecs" not in p.name]
    for hook in _hooks():
        # a plugin defines the hook, or binds a kit's implementation to its name
        assert any(f"def {hook}(" in s or f"\n{hook} = " in s for s in sources), \
            f"no plugin implements {hook}"
