"""The server's settings: one table, each row a flag with its env twin; argparse built from it.

Every value mlxcel takes from its operator is a row here, parsed and checked by the row's
type (a function of this module, which imports no MLX), so a bad value, given as a flag or
as its env twin, refuses to start before anything is loaded. The CLI resolves the table
once into ``Settings``, which is passed down; no other module reads ``os.environ`` for
mlxcel's own settings (``mlxcel.settings.library_env`` holds the variables of other
programs).
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from mlxcel import __version__
from mlxcel.errors import StartupError
from mlxcel.types import LoopPolicy


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def on_off(raw: str) -> bool:
    """A setting that is on by default: ``on``/``1``/... or ``off``/``0``/..."""
    try:
        return _bool(raw) if raw.strip() else True
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected on or off, got {raw!r}") from None


def auto_on_off(raw: str) -> bool | None:
    """``auto`` (None: the engine decides per device), or on / off."""
    if raw.strip().lower() in ("", "auto"):
        return None
    try:
        return _bool(raw)
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


def _choice(name: str) -> Any:
    """A parser for one of ``CHOICES[name]`` (case-insensitive), so that an env twin,
    which argparse's ``choices`` never sees, is checked too."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in CHOICES[name]:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(CHOICES[name])}, got {raw!r}")
        return value

    parse.__name__ = name
    return parse


def _path(raw: str) -> str:
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


# (flags, dest, type, default, env twin, help)
OPTIONS: list[tuple[tuple[str, ...], str, Any, Any, str, str]] = [
    (("-m", "--model"), "model", str, None, "LLAMA_ARG_MODEL",
     "model directory or Hugging Face id (org/name)"),
    (("-a", "--alias"), "alias", str, None, "LLAMA_ARG_ALIAS",
     "model name reported by the API (default: the model's folder name)"),
    (("--host",), "host", str, "127.0.0.1", "LLAMA_ARG_HOST", "address to listen on"),
    (("--port",), "port", int, 8080, "LLAMA_ARG_PORT", "port to listen on"),
    (("--api-key",), "api_key", str, None, "LLAMA_API_KEY",
     "require this key (Authorization: Bearer <key>, or x-api-key: <key>) on every route "
     "but /health and /; "
     "prefer the env twin or --api-key-file (a flag shows in ps)"),
    (("--api-key-file",), "api_key_file", str, None, "MLXCEL_API_KEY_FILE",
     "read the API key from this file's first line (not shown in ps, unlike --api-key)"),
    (("--allowed-hosts",), "allowed_hosts", str, None, "MLXCEL_ALLOWED_HOSTS",
     "comma-separated Host/Origin names accepted; default on a loopback bind: localhost, "
     "127.0.0.1 and ::1 only (DNS-rebinding and cross-site guard); '*' accepts any"),
    (("--max-connections",), "max_connections", int, 2048, "MLXCEL_MAX_CONNECTIONS",
     "open connections served at once; more wait in the listen backlog (the open-file "
     "limit is raised to fit)"),
    (("--idle-timeout",), "idle_timeout", float, 30.0, "MLXCEL_IDLE_TIMEOUT",
     "seconds a connection may wait for a request's headers (new or kept alive); then it "
     "is closed"),
    (("--body-timeout",), "body_timeout", float, 60.0, "MLXCEL_BODY_TIMEOUT",
     "seconds a request body may take to arrive after its headers (then 408)"),
    (("-to", "--timeout"), "timeout", float, 600.0, "LLAMA_ARG_TIMEOUT",
     "write timeout: seconds a response may wait for the client to read before the "
     "request is cancelled"),
    (("--shutdown-timeout",), "shutdown_timeout", float, 30.0, "MLXCEL_SHUTDOWN_TIMEOUT",
     "seconds SIGTERM/SIGINT lets running requests finish before the worker is killed; a "
     "second signal exits at once"),
    (("-c", "--ctx-size"), "ctx_size", int, 0, "LLAMA_ARG_CTX_SIZE",
     "context size in tokens, split over the slots; 0 = the model's own"),
    (("-np", "--parallel"), "parallel", int, 4, "LLAMA_ARG_N_PARALLEL",
     "number of sequences generated at once (slots)"),
    (("-n", "--n-predict"), "n_predict", int, -1, "LLAMA_ARG_N_PREDICT",
     "default max tokens when a request sets none; -1 = until the context is full"),
    (("--chat-template-file",), "chat_template_file", str, None,
     "LLAMA_ARG_CHAT_TEMPLATE_FILE", "Jinja chat template to use instead of the model's"),
    (("--chat-template-kwargs",), "chat_template_kwargs", chat_template_kwargs, None,
     "LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
     "JSON object of chat-template variables for every request, e.g. "
     "'{\"enable_thinking\": false}'; a request's own chat_template_kwargs win key by key"),
    (("--tool-call-format",), "tool_call_format", str, None, "MLXCEL_TOOL_CALL_FORMAT",
     "tool-call format the model's answers are parsed with, by name (mlxcel-server plugins "
     "lists them); default: the model family's, else the one its chat template shows"),
    (("--reasoning-format",), "reasoning_format", _choice("reasoning_format"), "auto",
     "LLAMA_ARG_THINK",
     "where reasoning goes: auto or deepseek = message.reasoning_content (split at the "
     "model's markers), deepseek-legacy = there and left in the content too, none = left "
     "in the content"),
    (("--reasoning-budget",), "reasoning_budget", reasoning_budget, -1,
     "LLAMA_ARG_THINK_BUDGET",
     "reasoning tokens an answer may generate before its reasoning block is closed for "
     "it: -1 = unrestricted, 0 = end it at once; a request's thinking budget wins"),
    (("--log-format",), "log_format", str, "console", "MLXCEL_LOG_FORMAT",
     "log line format: json or console"),
    (("--plugins",), "plugins", str, None, "MLXCEL_PLUGINS",
     "comma-separated allow-list of plugin names to load (default: all installed)"),
    (("--disable-plugins",), "disable_plugins", str, None, "MLXCEL_DISABLE_PLUGINS",
     "comma-separated plugin names not to load"),
    (("-b", "--prefill-chunk-size"), "prefill_chunk_size", int, 512, "LLAMA_ARG_BATCH",
     "prompt tokens prefilled per engine step (long prompts interleave with decoding)"),
    (("--max-queue-depth",), "max_queue_depth", int, 32, "MLXCEL_MAX_QUEUE_DEPTH",
     "requests that may wait for a slot; when full, new ones get 503 server_busy"),
    (("--grammar-compile-timeout",), "grammar_compile_timeout", float, 60.0,
     "MLXCEL_GRAMMAR_COMPILE_TIMEOUT",
     "seconds a response_format schema may take to compile before the request gets 400"),
    (("--responses-store-max-entries",), "responses_store_max_entries", int, 1024,
     "LLAMA_ARG_RESPONSES_STORE_MAX_ENTRIES",
     "stored /v1/responses answers kept for GET and previous_response_id (oldest dropped "
     "first); 0 = store none"),
    (("--responses-store-ttl-secs",), "responses_store_ttl_secs", float, 3600.0,
     "LLAMA_ARG_RESPONSES_STORE_TTL_SECS", "seconds a stored response lives"),
    (("--conversation-store-max-entries",), "conversation_store_max_entries", int, 256,
     "LLAMA_ARG_CONVERSATION_STORE_MAX_ENTRIES",
     "conversations (a Responses request's 'conversation' id) kept; 0 = keep none"),
    (("--conversation-store-ttl-secs",), "conversation_store_ttl_secs", float, 3600.0,
     "LLAMA_ARG_CONVERSATION_STORE_TTL_SECS",
     "seconds a conversation lives after its last turn"),
    (("--slots",), "slots", _bool, False, "LLAMA_ARG_ENDPOINT_SLOTS", "mount GET /slots"),
    (("--metrics",), "metrics", _bool, False, "LLAMA_ARG_ENDPOINT_METRICS",
     "mount GET /metrics (Prometheus text format)"),
    (("--metrics-port",), "metrics_port", int, 0, "MLXCEL_METRICS_PORT",
     "serve metrics on this separate port instead (0 = off)"),
    (("--dtype",), "dtype", _choice("dtype"), "auto", "MLXCEL_DTYPE",
     "compute dtype: auto (float32 on MLX's CPU device with OpenBLAS or for a quantized "
     "model, else the checkpoint's own), float32, float16 or bfloat16"),
    (("--no-fast-blas",), "no_fast_blas", _bool, False, "MLXCEL_NO_FAST_BLAS",
     "on Linux CPU, do not preload an optimized BLAS (OpenBLAS) even when installed"),
    (("--no-cache-prompt",), "no_cache_prompt", _bool, False, "LLAMA_ARG_NO_CACHE_PROMPT",
     "turn the prompt (prefix) cache off server-wide"),
    (("--cache-ram",), "cache_ram", int, 2048, "LLAMA_ARG_CACHE_RAM",
     "prompt cache capacity in MiB"),
    (("--prompt-cache-capacity-bytes",), "prompt_cache_capacity_bytes", int, 0,
     "MLXCEL_PROMPT_CACHE_CAPACITY_BYTES",
     "prompt cache capacity in bytes (overrides --cache-ram)"),
    (("--prompt-cache-max-entries",), "prompt_cache_max_entries", int, 1024,
     "MLXCEL_PROMPT_CACHE_MAX_ENTRIES", "most entries the prompt cache keeps"),
    (("--prompt-cache-ttl",), "prompt_cache_ttl", float, 3600.0, "MLXCEL_PROMPT_CACHE_TTL",
     "seconds a prompt cache entry lives"),
    # sampling defaults (unset: the checkpoint's generation_config.json, then built-ins)
    (("--temp",), "temp", float, None, "LLAMA_ARG_TEMP", "default temperature (0 = greedy)"),
    (("--top-k",), "top_k", int, None, "LLAMA_ARG_TOP_K", "default top-k (0 = off)"),
    (("--top-p",), "top_p", float, None, "LLAMA_ARG_TOP_P", "default top-p"),
    (("--min-p",), "min_p", float, None, "LLAMA_ARG_MIN_P", "default min-p (0 = off)"),
    (("--repeat-penalty",), "repeat_penalty", float, None, "LLAMA_ARG_REPEAT_PENALTY",
     "default repetition penalty (1.0 = off)"),
    (("--repeat-last-n",), "repeat_last_n", int, None, "LLAMA_ARG_REPEAT_LAST_N",
     "tokens the repetition penalty looks back over (-1 = whole context)"),
    (("--presence-penalty",), "presence_penalty", float, None, "LLAMA_ARG_PRESENCE_PENALTY",
     "default presence penalty"),
    (("--frequency-penalty",), "frequency_penalty", float, None,
     "LLAMA_ARG_FREQUENCY_PENALTY", "default frequency penalty"),
    (("--dry-multiplier",), "dry_multiplier", float, None, "LLAMA_ARG_DRY_MULTIPLIER",
     "default DRY multiplier (0 = off)"),
    (("--dry-base",), "dry_base", float, None, "LLAMA_ARG_DRY_BASE", "default DRY base"),
    (("--dry-allowed-length",), "dry_allowed_length", int, None,
     "LLAMA_ARG_DRY_ALLOWED_LENGTH", "default DRY allowed length"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, None,
     "LLAMA_ARG_DRY_PENALTY_LAST_N", "default DRY look-back (0 or -1 = whole context)"),
    (("--xtc-probability",), "xtc_probability", float, None, "LLAMA_ARG_XTC_PROBABILITY",
     "default XTC probability (0 = off)"),
    (("--xtc-threshold",), "xtc_threshold", float, None, "LLAMA_ARG_XTC_THRESHOLD",
     "default XTC threshold"),
    (("-s", "--seed"), "seed", int, None, "LLAMA_ARG_SEED",
     "default seed (-1 or unset = random)"),
    (("--demo",), "demo", _bool, False, "MLXCEL_DEMO",
     "serve a tiny random-weight checkpoint built offline; its output is random text"),
    # engine tuning and diagnosis (docs/reference/flags.md says what each one costs)
    (("--request-memory-budget",), "request_memory_budget", byte_size, None,
     "MLXCEL_REQUEST_MEMORY_BUDGET",
     "byte size (12G, 512M) that can only lower the per-request memory budget (unset: the "
     "device's); a request estimated above it gets 503 request_memory_budget_exceeded"),
    (("--loop-detection",), "loop_detection", loop_policy, None, "MLXCEL_LOOP_DETECTION",
     "loop-detection policy, off or MIN:MAX:COUNT (e.g. 1:20:4), over the model family's "
     "default; request fields override it"),
    (("--switch-interval",), "switch_interval", seconds_up_to_1, None,
     "MLXCEL_SWITCH_INTERVAL",
     "seconds in (0, 1] for sys.setswitchinterval (unset: 0.0005 on CUDA, Python's own "
     "elsewhere)"),
    (("--fuse-projections",), "fuse_projections", auto_on_off, "auto",
     "MLXCEL_FUSE_PROJECTIONS",
     "auto, 1 or 0: compute each layer's q/k/v and gate/up projections as one matmul each "
     "(auto: on with CUDA)"),
    (("--decode-attention",), "decode_attention", _choice("decode_attention"), "auto",
     "MLXCEL_DECODE_ATTENTION",
     "attention for batches with padded rows (auto: varlen on CUDA, composed on MLX's CPU "
     "device, fused on Metal)"),
    (("--shared-positions",), "shared_positions", on_off, "on", "MLXCEL_SHARED_POSITIONS",
     "on or off: decode a batch on one RoPE offset where the family and the model allow it"),
    (("--engine-trace",), "engine_trace", _path, None, "MLXCEL_ENGINE_TRACE",
     "write one JSON line per engine loop turn that did work to this file (diagnosis)"),
]
CHOICES = {"log_format": ["json", "console"],
           "reasoning_format": ["auto", "deepseek", "deepseek-legacy", "none"],
           "dtype": ["auto", "float32", "float16", "bfloat16"],
           "decode_attention": ["auto", "varlen", "grouped", "composed", "fused"]}


def _env_default(env: str, type_: Any, default: Any) -> Any:
    """The row's default as its env twin sets it (unset or empty: the table's default);
    a value its type refuses is a StartupError naming the variable."""
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return type_(raw)
    except argparse.ArgumentTypeError as exc:
        raise StartupError(f"environment variable {env}={raw!r}: {exc}") from None
    except ValueError:
        name = getattr(type_, "__name__", "value").lstrip("_")
        raise StartupError(f"environment variable {env}={raw!r} is not a valid {name}") from None


def env_default(dest: str) -> Any:
    """What the env twin of option ``dest`` sets (else the table's default), for a
    command that takes a few of the server's options (``mlxcel-server plugins``)."""
    for _flags, name, type_, default, env, _help in OPTIONS:
        if name == dest:
            value = _env_default(env, type_, default)
            return type_(value) if isinstance(value, str) and type_ is not str else value
    raise KeyError(dest)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default, except a secret taken from the environment."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.dest == "api_key":
            return f"{action.help} (default: none)"
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxcel-server",
        description="LLM inference server on MLX. `mlxcel-server plugins` lists plugins.",
        formatter_class=_HelpFormatter)
    for flags, dest, type_, default, env, help_ in OPTIONS:
        kwargs: dict[str, Any] = {"dest": dest, "type": type_,
                                  "default": _env_default(env, type_, default),
                                  "help": f"{help_} [env: {env}]"}
        if dest in CHOICES:
            kwargs["choices"] = CHOICES[dest]
        if type_ is _bool:  # a switch: present = on; the env twin sets the default
            del kwargs["type"]
            kwargs["action"] = "store_true"
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("--version", action="version", version=f"mlxcel {__version__}")
    return parser


