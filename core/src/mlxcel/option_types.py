"""The value parsers of the options table: each turns a flag's (or its env twin's) text
into the typed value ``Settings`` holds, raising ``argparse.ArgumentTypeError`` (or
``ValueError``) with a message for the user, so a bad value refuses to start before
anything is loaded. None of them imports MLX.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from mlxcel.types import LoopPolicy

# the llama column of the options table: what a llama-server flag does here
KEPT, MAPPED, PENDING, IGNORED = "kept", "mapped", "pending", "ignored"


def boolean(raw: str) -> bool:
    """A switch's env twin: 1/true/yes/on/enabled or 0/false/no/off/disabled (llama-server
    reads the same words)."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on", "enabled"):
        return True
    if value in ("0", "false", "no", "off", "disabled", ""):
        return False
    raise ValueError(raw)


def on_off(raw: str) -> bool:
    """A setting that is on by default: ``on``/``1``/... or ``off``/``0``/..."""
    try:
        return boolean(raw) if raw.strip() else True
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected on or off, got {raw!r}") from None


def auto_on_off(raw: str) -> bool | None:
    """``auto`` (None: the engine decides per device), or on / off."""
    if raw.strip().lower() in ("", "auto"):
        return None
    try:
        return boolean(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, 1 or 0, got {raw!r}") from None


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"12G"``, ``"512MiB"``, ``"1.5g"``, ``"1048576"`` -> bytes; > 0 or ValueError."""
    match = _SIZE.match(text or "")
    if not match:
        raise ValueError(f"not a byte size: {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise ValueError(f"byte size must be positive: {text!r}")
    return value


def byte_size(raw: str) -> int:
    """A positive byte size; ``0`` or ``none`` are refused, since a budget of nothing
    would refuse every request."""
    try:
        return parse_size(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "not a positive byte size (examples: 12G, 512M, 1073741824)") from None


_LOOP_SPEC = re.compile(r"^\s*(\d+)\s*[:,]\s*(\d+)\s*[:,]\s*(\d+)\s*$")


def loop_policy(raw: str) -> LoopPolicy:
    """``off`` or ``MIN:MAX:COUNT`` (e.g. ``1:20:4``): the server's loop-detection policy."""
    if raw.strip().lower() in ("off", "0", "none", "false"):
        return LoopPolicy(max_pattern_size=0)
    match = _LOOP_SPEC.match(raw)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected 'off' or MIN:MAX:COUNT, e.g. 1:20:4, got {raw!r}")
    low, high, count = (int(g) for g in match.groups())
    return LoopPolicy(min_pattern_size=max(1, low), max_pattern_size=high, min_count=count)


def reasoning_budget(raw: str) -> int:
    """-1 (unrestricted) or a number of tokens >= 0."""
    try:
        value = int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected -1 (unrestricted) or a number of tokens "
                                         f">= 0, got {raw!r}")
    return value


def reasoning_mode(raw: str) -> str:
    """llama-server's ``--reasoning``: ``on`` / ``off`` / ``auto``, with the words its
    parser also takes (``enabled``/``true``/``1``, ``disabled``/``false``/``0``, ``-1``)."""
    value = raw.strip().lower()
    if value in ("", "auto", "-1"):
        return "auto"
    try:
        return "on" if boolean(value) else "off"
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {raw!r}") from None


reasoning_mode.choices = ["on", "off", "auto"]  # type: ignore[attr-defined]


def seconds_up_to_1(raw: str) -> float:
    """A number of seconds in (0, 1]: a GIL switch interval beyond a second would stall
    the engine thread for that long."""
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, 1], got {raw!r}")
    return value


def choice(name: str, *values: str) -> Any:
    """A parser for one of ``values`` (case-insensitive), so that an env twin, which
    argparse's ``choices`` never sees, is checked too; ``.choices`` lists them for -h."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in values:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(values)}, got {raw!r}")
        return value

    parse.__name__ = name
    parse.choices = list(values)  # type: ignore[attr-defined]
    return parse


def path(raw: str) -> str:
    return raw.strip()


# set by the server for every render: neither a request nor --chat-template-kwargs may
RESERVED_TEMPLATE_KEYS = frozenset({"add_generation_prompt", "messages", "tools"})


def chat_template_kwargs(raw: str) -> dict[str, Any]:
    """A JSON object of extra chat-template variables (any keys but the reserved ones)."""
    import msgspec

    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        raise argparse.ArgumentTypeError(f"not valid JSON: {raw!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {raw!r}")
    reserved = sorted(RESERVED_TEMPLATE_KEYS & value.keys())
    if reserved:
        raise argparse.ArgumentTypeError(
            f"{', '.join(reserved)} is set by the server and cannot be given")
    return value


def text(raw: str) -> str:
    """Any value, kept as given: what an ignored llama-server flag takes."""
    return raw


def maybe_text(raw: str) -> str:
    """Like ``text``, for a flag whose value may be left out (``-fa`` or ``-fa on``)."""
    return raw


maybe_text.nargs = "?"  # type: ignore[attr-defined]


def parallel(raw: str) -> int:
    """Slots: a count, or llama-server's ``-1`` (auto), which is mlxcel's default of 4."""
    value = int(raw)
    return DEFAULT_PARALLEL if value == -1 else value


DEFAULT_PARALLEL = 4


class Toggle:
    """The type of a switch that comes in an on and an off spelling (``--jinja`` /
    ``--no-jinja``, ``-cb`` / ``-nocb``): ``off`` are the spellings that set False. Its env
    twin takes ``boolean``'s words."""

    __name__ = "boolean"

    def __init__(self, *off: str) -> None:
        self.off = frozenset(off)

    def __call__(self, raw: str) -> bool:
        return boolean(raw)


class ToggleAction(argparse.Action):
    """Sets True for the row's on spellings and False for its off ones."""

    def __init__(self, option_strings: list[str], dest: str, toggle: Toggle,
                 **kwargs: Any) -> None:
        self.toggle = toggle
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.toggle.off)


def canonical(flags: tuple[str, ...]) -> str:
    """The name an ignored row is logged under: its first ``--`` spelling."""
    return next((f for f in flags if f.startswith("--")), flags[0])


class IgnoredAction(argparse.Action):
    """Records an ignored flag as given (``{"--n-gpu-layers": "-ngl 99"}``) in its dest."""

    def __init__(self, option_strings: list[str], dest: str, key: str, **kwargs: Any) -> None:
        self.key = key
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any,
                 option_string: str | None = None) -> None:
        shown = option_string if values in (None, []) else f"{option_string} {values}"
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), self.key: shown})


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default, except a secret taken from the environment; an ignored flag
    shows why instead."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.dest == "api_key":
            return f"{action.help} (default: none)"
        if isinstance(action, IgnoredAction):
            return action.help or ""
        return super()._get_help_string(action) or ""
