"""Entry points of group ``mlxcel`` must be cheap to import: no MLX, mlx-lm, mlx-vlm or PIL.

Each check runs in a fresh interpreter, because this pytest process may already have
imported heavy modules for other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from mlxcel.testing.builtin_plugins import BUILTINS

HEAVY = ("mlx", "mlx_lm", "mlx_vlm", "PIL")
# Prints one JSON line: what was loaded and which heavy modules (or submodules) got imported.
_PRELUDE = textwrap.dedent(
    """
    import json, sys
    HEAVY = {heavy!r}

    def heavy_loaded():
        return sorted(m for m in sys.modules
                      if any(m == h or m.startswith(h + ".") for h in HEAVY))
    """
).format(heavy=HEAVY)

_LOAD_ENTRY_POINTS = _PRELUDE + textwrap.dedent(
    """
    from importlib.metadata import entry_points
    loaded = {}
    for ep in entry_points(group="mlxcel"):
        ep.load()
        loaded[ep.name] = ep.value
    print(json.dumps({"loaded": loaded, "heavy": heavy_loaded()}))
    """
)

_BUILD_PLUGIN_MANAGER = _PRELUDE + textwrap.dedent(
    """
    from mlxcel.plugins import load_plugins
    plugins = load_plugins()
    print(json.dumps({
        "infos": {i.name: i.status for i in plugins.infos},
        "families": sorted(plugins.families),
        "dialects": sorted(plugins.dialects),
        "tool_formats": sorted(plugins.tool_formats),
        "heavy": heavy_loaded(),
    }))
    """
)


def _fresh(code: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLXCEL_PLUGINS", "MLXCEL_DISABLE_PLUGINS")
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, f"fresh interpreter failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_every_entry_point_imports_no_heavy_module() -> None:
    result = _fresh(_LOAD_ENTRY_POINTS)
    assert result["heavy"] == [], (
        f"importing the mlxcel entry points imported heavy modules: {result['heavy']}"
    )
    for name, value in BUILTINS.items():
        assert result["loaded"].get(name) == value, (
            f"builtin entry point {name} = {value!r} missing; found {result['loaded']}"
        )


def test_building_the_plugin_manager_imports_no_heavy_module() -> None:
    result = _fresh(_BUILD_PLUGIN_MANAGER)
    assert result["heavy"] == [], (
        f"mlxcel.plugins.load_plugins() imported heavy modules: {result['heavy']}"
    )
    for name in BUILTINS:
        assert result["infos"].get(name) == "loaded", result["infos"]
    assert "mlx-lm-text" in result["families"]
    assert {"openai", "llamacpp"} <= set(result["dialects"])
    assert {"hermes", "llama3", "mistral_bracketed"} <= set(result["tool_formats"])
