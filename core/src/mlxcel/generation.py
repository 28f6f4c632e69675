"""Dialect-independent request building: defaults, validation, SamplingParams."""

from __future__ import annotations

from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.types import SamplingParams

# llama-server's defaults; a checkpoint's generation_config.json overrides them.
BUILTIN_SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}
SEED_UNSET = 18446744073709551615  # u64::MAX, as llama-server reports an unset seed
MAX_STOP_STRINGS = 16


def server_sampling_defaults(checkpoint: Any) -> dict[str, Any]:
    """Built-in defaults overlaid with the checkpoint's generation_config.json."""
    values = dict(BUILTIN_SAMPLING)
    for key in BUILTIN_SAMPLING:
        value = getattr(checkpoint.defaults, key)
        if value is not None:
            values[key] = value
    return values


def _check(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise InvalidRequest(f"'{field}' {message}", param=field)


def sampling_params(fields: dict[str, Any], defaults: dict[str, Any]) -> SamplingParams:
    """Request values (None = absent) over server defaults, validated."""
    v = {k: (fields.get(k) if fields.get(k) is not None else defaults[k]) for k in defaults}
    _check(v["temperature"] >= 0, "temperature", "must be >= 0")
    _check(0 <= v["top_p"] <= 1, "top_p", "must be between 0 and 1")
    _check(v["top_k"] >= 0, "top_k", "must be >= 0 (0 disables it)")
    _check(0 <= v["min_p"] <= 1, "min_p", "must be between 0 and 1")
    seed = fields.get("seed")
    _check(seed is None or 0 <= seed < 2**64, "seed", "must be a non-negative 64-bit integer")
    return SamplingParams(temperature=float(v["temperature"]), top_p=float(v["top_p"]),
                          top_k=int(v["top_k"]), min_p=float(v["min_p"]),
                          seed=None if seed is None or seed == SEED_UNSET else seed)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    _check(len(stops) <= MAX_STOP_STRINGS, "stop", f"takes at most {MAX_STOP_STRINGS} strings")
    return tuple(s for s in stops if s)


def max_tokens(value: int | None, field: str, n_predict: int) -> int | None:
    """Validated ``max_tokens``; None means 'until the context is full'."""
    if value is None:
        return n_predict if n_predict > 0 else None
    _check(value > 0, field, "must be a positive integer")
    return value
