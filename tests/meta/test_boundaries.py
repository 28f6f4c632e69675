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
