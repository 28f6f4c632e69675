"""A nesting limit on request JSON, checked without recursion."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from mlxcel.errors import InvalidRequest

MAX_JSON_DEPTH = 64  # objects/arrays inside one another, the outermost counting as 1
PARAM_PARTS = 3  # a too-deep location is named by its first few path parts (never deep keys)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]')


def _join(parts: list[str | int]) -> str | None:
    out = ""
    for part in parts[:PARAM_PARTS]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _parts(ref: Any) -> list[str | int]:
    parts: list[str | int] = []
    while ref is not None:
        ref, key = ref
        parts.append(key)
    return parts[::-1]


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> tuple[bool, str | None]:
    """(True, path) for the first container nested deeper than ``limit``, else (False,
    None). Iterative, so it is safe on input that would make a recursive walk overflow."""
    if not isinstance(value, (dict, list)):
        return False, None
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]
    while stack:
        node, depth, ref = stack.pop()
        if depth > limit:
            return True, _join(_parts(ref))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, (ref, key)))
    return False, None


def deep_path(body: bytes, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The path of the first container nested deeper than ``limit`` in raw JSON text (for
    bodies too deep to decode at all)."""
    frames: list[list[Any]] = []  # [is_object, key or index, expecting a key]
    for match in _TOKEN.finditer(body):
        tok = match.group()
        if tok in (b"{", b"["):
            if len(frames) >= limit:
                return _join([f[1] for f in frames if f[1] is not None])
            frames.append([tok == b"{", None if tok == b"{" else 0, True])
        elif tok in (b"}", b"]"):
            if frames:
                frames.pop()
        elif not frames:
            continue
        elif tok == b",":
            top = frames[-1]
            if top[0]:
                top[2] = True
            else:
                top[1] += 1
        elif frames[-1][0] and frames[-1][2]:
            frames[-1][1], frames[-1][2] = tok[1:-1].decode("utf-8", "replace"), False
    return None


def call_arguments(value: Any, where: str) -> Any:
    """A tool call's arguments as a chat template reads them: a JSON object's text becomes
    the object, an object stays one, any other string stays as it is; the nesting is
    bounded, because templates recurse through it. ``where`` names the field in errors."""
    too_deep_error = InvalidRequest(f"{where} is nested more than {MAX_JSON_DEPTH} levels "
                                    "deep", param=where)
    if value is not None and not isinstance(value, (str, dict)):
        raise InvalidRequest(f"{where} must be a JSON string or an object", param=where)
    if not isinstance(value, str):
        return value
    try:
        parsed = msgspec.json.decode(value)
    except RecursionError:
        raise too_deep_error from None
    except msgspec.DecodeError:
        return value
    if too_deep(parsed)[0]:
        raise too_deep_error
    return parsed if isinstance(parsed, dict) else value
