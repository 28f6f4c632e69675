"""A request's media knobs (``chat.media.MEDIA_OPTIONS``: ``max_soft_tokens``, Gemma 4's
per-request image token budget), read from every spelling a client of some server sends:

- the top-level field (``"max_soft_tokens": 280``), mlxcel's own;
- vLLM's ``mm_processor_kwargs`` object (``{"mm_processor_kwargs": {"max_soft_tokens":
  280}}``), which the OpenAI SDK's ``extra_body=`` merges into the body's top level.

A literal ``extra_body`` object counts as top-level fields (``wire.decode_body``), so
either form inside it is read too. mlx-vlm's own server has no such field (its image
knobs are ``min_pixels``, ``max_pixels`` and ``resize_shape``), so there is no spelling of
its to take. The top-level field wins. A value that is not a positive integer is a 400
naming where it was found; other keys of ``mm_processor_kwargs`` are ignored, as a
processor ignores a keyword it does not know.
"""

from __future__ import annotations

from typing import Any

from mlxcel.chat.media import MEDIA_OPTIONS
from mlxcel.errors import InvalidRequest

KWARGS = "mm_processor_kwargs"


def _object(value: Any, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{param}' must be an object", param=param)
    return value


def _positive(value: Any, param: str) -> int:
    if type(value) is not int or value <= 0:
        raise InvalidRequest(f"'{param}' must be a positive integer", param=param)
    return value


def media_options(body: Any) -> dict[str, Any]:
    """The media knobs of a request body with ``max_soft_tokens`` and
    ``mm_processor_kwargs`` fields (absent: None), checked."""
    sources = [("", {key: getattr(body, key, None) for key in MEDIA_OPTIONS}),
               (f"{KWARGS}.", _object(getattr(body, KWARGS, None), KWARGS))]
    out: dict[str, Any] = {}
    for key in MEDIA_OPTIONS:
        for prefix, source in sources:
            if source.get(key) is not None:
                out[key] = _positive(source[key], prefix + key)
                break
    return out
