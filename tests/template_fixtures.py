"""The real chat templates in tests/chat_templates, read with their SOURCES.toml entries
(file, model, family, source, licence, bos and eos tokens)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).parent / "chat_templates"
SOURCES: dict[str, dict[str, Any]] = tomllib.loads(
    (HERE / "SOURCES.toml").read_text(encoding="utf-8"))


def source_of(name: str) -> str:
    """The template text of fixture ``name``, exactly as shipped."""
    return (HERE / SOURCES[name]["file"]).read_bytes().decode("utf-8")
