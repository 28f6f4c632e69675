"""The checkpoint model_types that the installed mlx-lm implements, found as mlx-lm finds them.

mlx-lm loads a checkpoint with the module ``mlx_lm.models.<type>``, after mapping the type
through its ``MODEL_ARCHITECTURE_REMAPPING`` and ``MODEL_REMAPPING`` tables
(``mlx_lm.utils._get_classes``). Importing mlx-lm imports MLX, which the server must not
do before Granian forks its worker, so this module reads the installed mlx-lm's files
instead: both tables as literals from the source of ``mlx_lm/utils.py``, and a module counts
as a model when it binds ``Model`` and ``ModelArgs`` at its top level. Whatever mlx-lm
adds in a new release is then accepted without a list kept here.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_TABLES = ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING")


@functools.cache
def package_dir() -> Path | None:
    """mlx-lm's package directory (found, not imported); None when it is not installed."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _literal_tables(source: str) -> dict[str, dict]:
    """The remapping tables assigned at the top level of ``source`` ({} where absent)."""
    found: dict[str, dict] = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id in _TABLES:
                value = ast.literal_eval(node.value)
                if isinstance(value, dict):
                    found[target.id] = value
    return found


@functools.cache
def remapping() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """mlx-lm's (MODEL_REMAPPING, MODEL_ARCHITECTURE_REMAPPING)."""
    root = package_dir()
    utils = root / "utils.py" if root else None
    if utils is None or not utils.is_file():
        return {}, {}
    tables = _literal_tables(utils.read_text(encoding="utf-8"))
    return tables.get(_TABLES[0], {}), tables.get(_TABLES[1], {})


def module_name(model_type: str, architectures: object = ()) -> str:
    """The ``mlx_lm.models`` module mlx-lm would load for this type (``_get_classes``)."""
    by_type, by_arch = remapping()
    archs = (architectures,) if isinstance(architectures, str) else architectures
    for arch in archs if isinstance(archs, (list, tuple)) else ():
        remapped = by_arch.get((model_type, arch))
        if remapped is not None:
            return remapped
    return by_type.get(model_type, model_type)


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


@functools.cache
def is_model_module(name: str) -> bool:
    """``mlx_lm/models/<name>.py`` exists and binds both ``Model`` and ``ModelArgs``."""
    root = package_dir()
    if root is None or not _NAME.fullmatch(name):
        return False
    path = root / "models" / f"{name}.py"
    if not path.is_file():
        return False
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    return {"Model", "ModelArgs"} <= _top_level_names(tree)


def accepts(model_type: str, config: dict) -> bool:
    """Whether mlx-lm implements this checkpoint's ``model_type``."""
    return is_model_module(module_name(model_type, config.get("architectures") or ()))


def check(path: Path, config: dict) -> bool | str:
    """The generic text family's ``check``: a text decoder's checkpoint whose
    ``model_type`` the installed mlx-lm implements."""
    from mlxcel.families.text import side_model_reason

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not accepts(model_type, config):
        return f"mlx-lm does not implement model_type '{model_type}'"
    return side_model_reason(path, config) or True


def model_types() -> tuple[str, ...]:
    """Every model_type mlx-lm loads: its model modules and the types remapped onto them."""
    root = package_dir()
    if root is None:
        return ()
    modules = {p.stem for p in (root / "models").glob("*.py") if is_model_module(p.stem)}
    by_type, by_arch = remapping()
    aliases = {t for t, m in by_type.items() if m in modules}
    aliases |= {t for (t, _), m in by_arch.items() if m in modules}
    return tuple(sorted(modules | aliases))
