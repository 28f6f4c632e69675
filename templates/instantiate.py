"""Copy ``templates/distribution`` to a new distribution folder, filling in its names.

    python templates/instantiate.py plugins/toolcall-foo     # mlxcel-toolcall-foo
    python templates/instantiate.py families/foo             # mlxcel-family-foo

Names follow the repository's rule (ARCHITECTURE.md, section 2): the folder is the
distribution name without ``mlxcel-``, except under ``families/`` where it is the family's
name alone; ``--dist``, ``--package``, ``--entry-point`` and ``--tool-format`` override any
of them (a third party's package is named as it likes). The placeholders are listed in
``templates/README.md``; one rule derives them all, so the names can never disagree.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

SKELETON = pathlib.Path(__file__).resolve().parent / "distribution"
PLACEHOLDERS = ("dist", "package", "entry_point", "tool_format")


def names(dest: pathlib.Path, **given: str | None) -> dict[str, str]:
    """Every placeholder's value for a distribution in ``dest``; ``given`` ones win."""
    point = given.get("entry_point") or (
        f"family-{dest.name}" if dest.parent.name == "families" else dest.name)
    dist = given.get("dist") or f"mlxcel-{point}"
    return {
        "dist": dist,
        "package": given.get("package") or dist.replace("-", "_"),
        "entry_point": point,
        "tool_format": given.get("tool_format") or point.partition("-")[2] or point,
    }


def instantiate(dest: pathlib.Path, values: dict[str, str]) -> list[pathlib.Path]:
    """Write the skeleton under ``dest`` (which must not exist yet) with ``values`` filled
    into every file's text and path; the files written."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists; pick a new folder")
    written = []
    for src in sorted(p for p in SKELETON.rglob("*") if p.is_file()):
        if "__pycache__" in src.parts:
            continue
        rel, text = src.relative_to(SKELETON).as_posix(), src.read_text()
        for key in PLACEHOLDERS:
            rel, text = (s.replace(f"{{{{{key}}}}}", values[key]) for s in (rel, text))
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=pathlib.Path)
    for key in PLACEHOLDERS:
        parser.add_argument(f"--{key.replace('_', '-')}")
    args = parser.parse_args(argv)
    values = names(args.dest, **{k: getattr(args, k) for k in PLACEHOLDERS})
    for path in instantiate(args.dest, values):
        print(path)
    print(f"next: add the tox env {values['entry_point']} (templates/README.md)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
