"""Dialect-independent request building: server defaults, validation, SamplingParams,
loop-detection policy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mlxcel.errors import InvalidRequest, StartupError
from mlxcel.types import LoopPolicy, SamplingParams


def one_prompt(value: Any) -> bool:
    """llama-server's rule for a ``prompt`` (or an embedding ``input``): a string, an
    object, or a list of token ids (strings may be mixed in when there is at least one
    id) is one prompt; any other list is a list of prompts."""
    if isinstance(value, (str, dict)):
        return True
    return isinstance(value, list) and any(type(p) is int for p in value) and all(
        type(p) in (int, str) for p in value)


# llama-server's defaults; generation_config.json, then the CLI flags, override them.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "p_less": False,
    "repetition_penalty": 1.0, "repetition_context_size": 64, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75,
    "dry_allowed_length": 2, "dry_penalty_last_n": 0, "dry_sequence_breakers": (),
    "xtc_probability": 0.0, "xtc_threshold": 0.1, "seed": None,
}
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Settings attribute (CLI flag) -> SamplingParams field
FLAG_FIELDS = {
    "temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "repeat_penalty": "repetition_penalty", "repeat_last_n": "repetition_context_size",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "dry_multiplier": "dry_multiplier", "dry_base": "dry_base",
    "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
    "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold", "seed": "seed",
}
SEED_UNSET = 18446744073709551615  # u64::MAX: what llama-server reports for "no seed"
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20

INT_LIMIT = 2**31  # int fields (top_k, window lengths): beyond it no context can reach

Check = Callable[[Any], bool]


def _real(check: Check) -> Check:
    """``check`` on a finite number (bools are not numbers here): NaN and inf, which JSON
    decoders may produce from literals like ``1e999``, never reach the sampler."""
    return lambda v: isinstance(v, int | float) and not isinstance(v, bool) \
        and math.isfinite(v) and check(v)


def _integer(check: Check) -> Check:
    """``check`` on an int within +-INT_LIMIT."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) \
        and -INT_LIMIT <= v <= INT_LIMIT and check(v)


RULES: dict[str, tuple[Check, str]] = {
    "temperature": (_real(lambda v: v >= 0), "must be a finite number >= 0 (0 = greedy)"),
    "top_p": (_real(lambda v: 0 <= v <= 1), "must be between 0 and 1"),
    "top_k": (_integer(lambda v: v >= 0), f"must be an integer from 0 (off) to {INT_LIMIT}"),
    "min_p": (_real(lambda v: 0 <= v <= 1), "must be between 0 and 1"),
    "p_less": (lambda v: isinstance(v, bool), "must be true or false"),
    "repetition_penalty": (_real(lambda v: v > 0),
                           "must be a finite number > 0 (1.0 = no penalty)"),
    "repetition_context_size": (_integer(lambda v: v >= -1),
                                f"must be an integer from -1 (whole context) to {INT_LIMIT}"),
    "frequency_penalty": (_real(lambda v: -2 <= v <= 2), "must be between -2 and 2"),
    "presence_penalty": (_real(lambda v: -2 <= v <= 2), "must be between -2 and 2"),
    "dry_multiplier": (_real(lambda v: v >= 0), "must be a finite number >= 0 (0 disables DRY)"),
    "dry_base": (_real(lambda v: v >= 1), "must be a finite number >= 1"),
    "dry_allowed_length": (_integer(lambda v: v >= 0),
                           f"must be an integer from 0 to {INT_LIMIT}"),
    "dry_penalty_last_n": (_integer(lambda v: v >= -1),
                           f"must be an integer from -1 (0 or -1 = whole context) to {INT_LIMIT}"),
    "dry_sequence_breakers": (
        lambda v: isinstance(v, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in v),
        "must be a list of token ids >= 0"),
    "xtc_probability": (_real(lambda v: 0 <= v <= 1), "must be between 0 and 1"),
    "xtc_threshold": (_real(lambda v: 0 <= v <= 1), "must be between 0 and 1"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64,
             "must be a non-negative 64-bit integer"),
}

def server_sampling_defaults(checkpoint: Any, settings: Any = None) -> dict[str, Any]:
    """Built-in defaults < checkpoint generation_config.json < CLI flags."""
    values = dict(SAMPLING_DEFAULTS)
    for key in GENERATION_CONFIG_KEYS:
        value = getattr(checkpoint.defaults, key, None)
        if value is not None:
            values[key] = value
    for flag, field in FLAG_FIELDS.items():
        value = getattr(settings, flag, None)
        if value is not None:
            values[field] = value
    if values["seed"] is not None and values["seed"] < 0:
        values["seed"] = None  # -1 on the command line: no fixed seed
    return values


def _check(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise InvalidRequest(f"'{field}' {message}", param=field)


def sampling_params(fields: dict[str, Any], defaults: dict[str, Any], *,
                    logprobs: bool = False, top_logprobs: int = 0,
                    names: dict[str, str] | None = None) -> SamplingParams:
    """Request values (None = absent) over server defaults, validated by ``RULES``;
    ``names`` gives a field's wire name where the dialect spells it otherwise (errors name
    the field the client sent)."""
    values = {}
    for key, default in defaults.items():
        given = fields.get(key)
        if given is not None:
            check, message = RULES[key]
            _check(check(given), (names or {}).get(key, key), message)
            values[key] = given
        else:
            values[key] = default
    if values["seed"] == SEED_UNSET:
        values["seed"] = None
    _check(0 <= top_logprobs <= MAX_TOP_LOGPROBS, "top_logprobs",
           f"must be between 0 and {MAX_TOP_LOGPROBS}")
    values["dry_sequence_breakers"] = tuple(values["dry_sequence_breakers"] or ())
    if values["repetition_context_size"] == -1:
        values["repetition_context_size"] = 0  # 0 inside the engine = whole context
    if values["dry_penalty_last_n"] == -1:
        values["dry_penalty_last_n"] = 0
    return SamplingParams(**values, logprobs=logprobs, top_logprobs=top_logprobs)


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


# the spec's three names for one reasoning budget, as clients of different servers send it
REASONING_BUDGET_ALIASES = ("thinking_budget_tokens", "reasoning_budget_tokens",
                            "thinking_budget")


def reasoning_budget(fields: dict[str, Any]) -> int | None:
    """The request's reasoning budget in tokens from whichever alias it sends (None: none
    sent; -1 unrestricted, 0 no reasoning, N > 0 at most N tokens, llama-server's
    ``--reasoning-budget`` values). Aliases that disagree are a 400: either value would be
    a guess."""
    given = {k: fields[k] for k in REASONING_BUDGET_ALIASES if fields.get(k) is not None}
    for key, value in given.items():
        _check(isinstance(value, int) and not isinstance(value, bool)
               and -1 <= value <= INT_LIMIT, key,
               f"must be an integer from -1 (unrestricted) to {INT_LIMIT}")
    if len(set(given.values())) > 1:
        names = " and ".join(f"'{k}'" for k in given)
        raise InvalidRequest(f"{names} give different reasoning budgets; send one",
                             param=next(iter(given)))
    return next(iter(given.values()), None)


# -- loop detection -----------------------------------------------------------------------
def server_loop_policy(family_policy: Any, override: LoopPolicy | None = None
                       ) -> LoopPolicy | None:
    """``override`` (``--loop-detection``, parsed by ``mlxcel.options.loop_policy``) if set,
    else the family's default (None = off)."""
    if override is not None:
        return override
    if family_policy is None:
        return None
    return LoopPolicy(min_pattern_size=family_policy.min_pattern_size,
                      max_pattern_size=family_policy.max_pattern_size,
                      min_count=family_policy.min_count)


def request_loop_policy(fields: dict[str, int | None], server: LoopPolicy | None
                        ) -> LoopPolicy | None:
    """Any of the three request fields (``max_pattern_size: 0`` included) overrides the
    server policy; fields the request leaves out keep the server's (or default) values."""
    given = {k: v for k, v in fields.items() if v is not None}
    for key, value in given.items():
        _check(value >= 0, key, "must be >= 0")
    if not given:
        return server
    base = server or LoopPolicy()
    policy = LoopPolicy(
        min_pattern_size=max(1, given.get("min_pattern_size", base.min_pattern_size)),
        max_pattern_size=given.get("max_pattern_size", base.max_pattern_size),
        min_count=given.get("min_count", base.min_count))
    return policy if policy.enabled else None


def check_server_settings(settings: Any) -> None:
    """Startup check: the sampling flags follow the request rules (``RULES``), so that a
    default no request could set refuses to start."""
    for flag, field in FLAG_FIELDS.items():
        value = getattr(settings, flag, None)
        if value is None or (field == "seed" and value < 0):
            continue
        check, message = RULES[field]
        if not check(value):
            raise StartupError(f"--{flag.replace('_', '-')} {value}: {message}")
