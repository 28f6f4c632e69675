"""A constraint's markers (``mlxcel.types.constraints``), resolved for one vocabulary.

A pattern holds ``mark(i)`` where ``markers[i]`` goes. For a vocabulary whose added
tokens include the marker's text, the mark stays, and the backend's vocabulary gives its
byte (U+0001 + i) to that token alone; otherwise the mark becomes the marker's text, which
plain tokens spell. Model-vocabulary tokens that hold a mark byte are left out of every
constrained output, so a mark is reachable through its marker token only. That costs no
output: outlines-core's JSON never holds control characters, and a pattern's free text
excludes the marks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from mlxcel.errors import UnsupportedSchema
from mlxcel.types.constraints import MAX_MARKERS, literal, mark

_MARK_BYTE = re.compile(b"[\\x01-\\x%02x]" % MAX_MARKERS)


def check_markers(markers: tuple[str, ...]) -> None:
    """At most ``MAX_MARKERS``, each a distinct non-empty text."""
    if len(markers) > MAX_MARKERS:
        raise UnsupportedSchema(f"a constraint names at most {MAX_MARKERS} markers")
    if not all(isinstance(m, str) and m for m in markers) or len(set(markers)) < len(markers):
        raise UnsupportedSchema("a constraint's markers are distinct, non-empty texts")


def marked(text: str, markers: tuple[str, ...]) -> str:
    """``text`` as a pattern: each occurrence of a marker (the longest, where two start
    at one place) as its mark, the rest literal."""
    order = sorted(range(len(markers)), key=lambda i: -len(markers[i]))
    out, pos = [], 0
    while pos < len(text):
        hit = next((i for i in order if text.startswith(markers[i], pos)), None)
        if hit is None:
            out.append(literal(text[pos]))
            pos += 1
        else:
            out.append(mark(hit))
            pos += len(markers[hit])
    return "".join(out)


def resolve(pattern: str, markers: tuple[str, ...],
            added: Mapping[str, int]) -> tuple[str, tuple[tuple[bytes, int], ...]]:
    """``pattern`` for a vocabulary whose added tokens are ``added``: a marker without a
    token of its own becomes its text. Also the (mark byte, token id) keys the index's
    vocabulary needs for the markers that stay."""
    keys = []
    for i, marker in enumerate(markers):
        token = added.get(marker)
        if token is None:
            pattern = pattern.replace(mark(i), literal(marker))
        else:
            keys.append((mark(i).encode(), token))
    return pattern, tuple(keys)


def holds_mark(raw: bytes) -> bool:
    """Whether a model-vocabulary token's bytes hold a mark byte (it is left out)."""
    return _MARK_BYTE.search(raw) is not None
