"""Constrained decoding: a backend protocol, the outlines-core backend, the token
vocabulary it matches against, and the compiler that caches its indexes.

The engine step fills one int32 ``(B, W)`` mask buffer per step, one row per constrained
row, through each row's ``Matcher.write_mask_into`` (``protocol`` is the reference).
"""

from mlxcel.engine.constraints.compiler import (
    CacheBudget,
    CompileStats,
    ConstraintCompiler,
    default_cache_dir,
)
from mlxcel.engine.constraints.limits import MAX_DEPTH, MAX_REFS, MAX_SCHEMA_BYTES
from mlxcel.engine.constraints.outlines import OutlinesBackend
from mlxcel.engine.constraints.protocol import Compiled, ConstraintBackend, Matcher, mask_words
from mlxcel.engine.constraints.vocabulary import TokenVocabulary

__all__ = [
    "MAX_DEPTH", "MAX_REFS", "MAX_SCHEMA_BYTES", "CacheBudget", "CompileStats", "Compiled",
    "ConstraintBackend", "ConstraintCompiler", "Matcher", "OutlinesBackend", "TokenVocabulary",
    "default_cache_dir", "mask_words",
]
