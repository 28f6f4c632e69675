"""Constrained decoding: a backend protocol, the outlines-core backend (JSON schemas and
regexes), the llguidance backend (GBNF grammars), the token vocabulary both match against,
and the compiler that caches their indexes.

The engine step fills one int32 ``(B, W)`` mask buffer per step, one row per constrained
row, through each row's ``Matcher.write_mask_into`` (``protocol`` is the reference).
Names are imported on first use: the engine step imports ``protocol`` on every server's
start, outlines-core loads only for a server that sees a schema, and llguidance only for one
that sees a grammar.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "CacheBudget": "compiler", "CompileStats": "compiler", "ConstraintCompiler": "compiler",
    "default_cache_dir": "compiler", "MAX_DEPTH": "limits", "MAX_REFS": "limits",
    "MAX_SCHEMA_BYTES": "limits", "OutlinesBackend": "outlines",
    "LLGuidanceBackend": "llguidance", "Compiled": "protocol",
    "ConstraintBackend": "protocol", "Matcher": "protocol", "mask_words": "protocol",
    "TokenVocabulary": "vocabulary",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
