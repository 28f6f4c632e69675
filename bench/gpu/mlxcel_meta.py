"""Write an ``mlxcel-<version>.dist-info`` (METADATA + entry_points.txt) into DIR.

mlxcel finds its own plugins (text family, dialects) through entry points, which need
installed distribution metadata. On the GPU machine the source runs from the working tree
(``PYTHONPATH=core/src``) and there is no build backend to install it with, so this writes
the metadata from core/pyproject.toml; put DIR on PYTHONPATH as well.

    python bench/gpu/mlxcel_meta.py /tmp/mlxcel-meta [families/embeddings ...]

Each further argument is another distribution of the repository (its folder) whose
metadata is written too, so its plugin's entry point is found the same way.
"""

from __future__ import annotations

import pathlib
import re
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    for folder in ["core", *sys.argv[2:]]:
        write(out, ROOT / folder)
    return 0


def write(out: pathlib.Path, folder: pathlib.Path) -> None:
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    # The folder's name is the wheel's escaped one (dashes to underscores): importlib.metadata
    # takes a distribution's name from the stem before its first dash and keeps one
    # distribution per name, so "mlxcel-family-x-0.1.0" would hide behind "mlxcel".
    stem = re.sub(r"[-_.]+", "_", project["name"]).lower()
    info = out / f"{stem}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    text = "".join(
        f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for g, eps in groups.items()
    )
    (info / "entry_points.txt").write_text(text)
    print(info)


if __name__ == "__main__":
    sys.exit(main())
