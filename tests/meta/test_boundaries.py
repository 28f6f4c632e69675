"""Meta-tests: the layering the architecture promises, checked on the code itself."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> list[str]:
    probe = (f"import sys; {code}; print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return out.split()


def test_the_engine_imports_neither_litestar_nor_a_dialect():
    """The engine is driven by dialects, never the other way round: every engine module,
    imported alone, pulls in no web framework and no dialect."""
    engine = sorted(p.stem for p in (ROOT / "core/src/mlxcel/engine").rglob("*.py")
                    if p.stem != "__init__")
    rel = [p.relative_to(ROOT / "core/src").with_suffix("")
           for p in (ROOT / "core/src/mlxcel/engine").rglob("*.py") if p.stem != "__init__"]
    code = "; ".join(f"import {'.'.join(r.parts)}" for r in rel)
    loaded = _modules_after(code)
    assert engine and not [m for m in loaded if m.split(".")[0] in ("litestar", "granian")]
    assert not [m for m in loaded if m.startswith("mlxcel.dialects")]


def test_hookimpl_comes_from_the_top_package_cheaply():
    loaded = _modules_after("from mlxcel import hookimpl")
    assert "pluggy" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("mlx", "mlx_lm", "litestar")]


def test_the_chat_layer_imports_no_dialect_no_web_framework_and_no_mlx():
    """Every dialect builds on ``mlxcel.chat``; it must not depend on any of them."""
    rel = [p.relative_to(ROOT / "core/src").with_suffix("")
           for p in (ROOT / "core/src/mlxcel/chat").rglob("*.py")]
    loaded = _modules_after("; ".join(f"import {'.'.join(r.parts)}" for r in rel))
    assert "mlxcel.chat.request" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("litestar", "granian", "mlx")]
    assert not [m for m in loaded if m.startswith("mlxcel.dialects")]


def _imports_of(folder: str) -> dict[str, set[str]]:
    """Module -> the mlxcel modules it imports (at any depth of its code), read with ast."""
    import ast

    out: dict[str, set[str]] = {}
    for path in (ROOT / "core/src" / folder).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        out[str(path.relative_to(ROOT / "core/src"))] = {n for n in names
                                                        if n.startswith("mlxcel")}
    return out


SHELL = ("mlxcel.settings", "mlxcel.options", "mlxcel.cli", "mlxcel.app", "mlxcel.serving",
         "mlxcel.plugins", "mlxcel.context", "mlxcel.engines")


def test_the_engine_and_the_model_import_nothing_from_chat_or_the_shell():
    """The path runs one way, wire -> chat -> engine, over the checkpoint's assets in
    ``mlxcel.model``: the engine and the model never reach up into the chat layer, the
    dialects, or the process shell (settings, options, CLI, app)."""
    above = ("mlxcel.chat", "mlxcel.dialects", *SHELL)
    for folder in ("mlxcel/engine", "mlxcel/model"):
        for module, names in _imports_of(folder).items():
            bad = [n for n in names if n.startswith(above)]
            assert not bad, f"{module} imports {bad}"


def test_nothing_above_the_engine_reaches_into_its_internals():
    """Chat, dialects and builtins use the engine through its client and its side
    engines only (and the model's assets through ``mlxcel.model``)."""
    public = ("mlxcel.engine.client", "mlxcel.engine.side", "mlxcel.engine.lanes",
              "mlxcel.engine.constraints")
    for folder in ("mlxcel/chat", "mlxcel/dialects", "mlxcel/builtin", "mlxcel/retrieval"):
        for module, names in _imports_of(folder).items():
            bad = [n for n in names if n.startswith("mlxcel.engine") and not n.startswith(public)]
            assert not bad, f"{module} imports {bad}"
