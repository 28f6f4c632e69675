"""The server's settings: one table, each row a flag with its env twin; argparse built from it.

Every value mlxcel takes from its operator is a row here, parsed and checked by the row's
type (``mlxcel.option_types``, which imports no MLX), so a bad value, given as a flag or
as its env twin, refuses to start before anything is loaded. The CLI resolves the table
once into ``Settings``, which is passed down; no other module reads ``os.environ`` for
mlxcel's own settings (``mlxcel.backend.library_env`` holds the variables of other
programs).

A row's ``llama`` column says what a llama-server flag does here, so a llama-server
command line carries over (docs/reference/flags.md shows it): ``kept`` (same meaning),
``mapped`` (llama.cpp's meaning translated onto this engine, the help says how),
``pending`` (stored in Settings; its feature is not served yet), ``ignored`` (no meaning
on MLX: accepted with its value, named in one startup log line with the help's reason),
or None for mlxcel's own flags. A flag in neither is unknown and refuses to start. The
side models' rows are ``mlxcel.options_side``'s, the ignored ones ``mlxcel.options_ignored``'s.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple

from mlxcel import __version__
from mlxcel.errors import StartupError
from mlxcel.model.chat_templates import chat_template_value
from mlxcel.option_types import (  # noqa: F401 (re-exported: the table's types)  # noqa: F401 (the kinds)
    IGNORED,
    KEPT,
    MAPPED,
    PENDING,
    RESERVED_TEMPLATE_KEYS,
    HelpFormatter,
    IgnoredAction,
    Toggle,
    ToggleAction,
    auto_on_off,
    boolean,
    byte_size,
    canonical,
    chat_template_kwargs,
    choice,
    loop_policy,
    maybe_text,
    on_off,
    parallel,
    parse_size,
    path,
    reasoning_budget,
    reasoning_mode,
    seconds_up_to_1,
    text,
)
from mlxcel.options_cache import CACHE_ROWS
from mlxcel.options_ignored import IGNORED_ROWS
from mlxcel.options_media import MEDIA_ROWS
from mlxcel.options_reasoning import REASONING_ROWS, _ServerParser
from mlxcel.options_side import SIDE_ROWS
from mlxcel.options_spec import SPEC_ROWS

IGNORED_DEST = "ignored_flags"  # where every ignored row's value goes: {flag: value}


class Option(NamedTuple):
    """One row of the table (see the module docstring for ``llama``)."""

    flags: tuple[str, ...]
    dest: str
    type: Any
    default: Any
    env: str | None  # None only for llama-server flags that have no env twin there
    help: str
    llama: str | None = None
    env_also: str | None = None  # a second env twin, read when the first is unset



# (flags, dest, type, default, env twin, help[, llama]); see Option
_ROWS: list[tuple[Any, ...]] = [
    (("-m", "--model"), "model", str, None, "LLAMA_ARG_MODEL",
     "model directory or Hugging Face id (org/name)", KEPT),
    (("-a", "--alias"), "alias", str, None, "LLAMA_ARG_ALIAS",
     "model names reported by the API, comma-separated: /v1/models lists each, answers "
     "name the first (default: the model's folder name)", KEPT),
    (("--tags",), "tags", str, None, "LLAMA_ARG_TAGS",
     "model tags, comma-separated, listed in each /v1/models entry (informational)", KEPT),
    (("--host",), "host", str, "127.0.0.1", "LLAMA_ARG_HOST",
     "address to listen on; several comma-separated addresses are each bound "
     "(127.0.0.1,::1)", KEPT),
    (("--port",), "port", int, 8080, "LLAMA_ARG_PORT", "port to listen on", KEPT),
    (("--api-key",), "api_key", str, None, "LLAMA_API_KEY",
     "require one of these comma-separated keys (Authorization: Bearer <key>, or "
     "x-api-key: <key>) on every route but /health, /live and /; "
     "prefer the env twin or --api-key-file (a flag shows in ps)", KEPT),
    (("--api-key-file",), "api_key_file", str, None, "LLAMA_ARG_API_KEY_FILE",
     "read the API keys from this file, one per line; blank lines and lines starting "
     "with # are skipped (not shown in ps, unlike --api-key)", KEPT),
    (("--allowed-hosts",), "allowed_hosts", str, None, "MLXCEL_ALLOWED_HOSTS",
     "comma-separated Host names accepted; default on a loopback bind: localhost, "
     "127.0.0.1 and ::1 only (DNS-rebinding guard); '*' accepts any"),
    (("--cors-origins",), "cors_origins", str, "localhost", "LLAMA_ARG_CORS_ORIGINS",
     "comma-separated origins answered with CORS headers (every OPTIONS is a preflight, "
     "answered 200 without a key); '*' = any, 'localhost' = loopback origins on any "
     "port; others get no CORS headers (not 403); listed origins' hosts pass the Host "
     "guard; 'null' is never answered", KEPT),
    (("--cors-methods",), "cors_methods", str, "GET, POST, DELETE, OPTIONS",
     "LLAMA_ARG_CORS_METHODS", "comma-separated methods a CORS preflight allows", KEPT),
    (("--cors-headers",), "cors_headers", str, "*", "LLAMA_ARG_CORS_HEADERS",
     "comma-separated request headers a CORS preflight allows ('*': those it asks for)",
     KEPT),
    (("--cors-credentials", "--no-cors-credentials"), "cors_credentials",
     Toggle("--no-cors-credentials"), True, "LLAMA_ARG_CORS_CREDENTIALS",
     "CORS answers allow credentials (cookies, Authorization)", KEPT),
    (("--threads-http",), "threads_http", int, -1, "LLAMA_ARG_THREADS_HTTP",
     "threads of Granian's runtime that move HTTP bytes (-1 = 1); requests are handled "
     "on one asyncio loop whatever this is", MAPPED),
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
     "request is cancelled", KEPT),
    (("--shutdown-timeout",), "shutdown_timeout", float, 30.0, "MLXCEL_SHUTDOWN_TIMEOUT",
     "seconds SIGTERM/SIGINT lets running requests finish before the worker is killed; a "
     "second signal exits at once"),
    (("-c", "--ctx-size"), "ctx_size", int, 0, "LLAMA_ARG_CTX_SIZE",
     "context size in tokens, split over the slots; 0 = the model's own", KEPT),
    (("-np", "--parallel"), "parallel", parallel, 4, "LLAMA_ARG_N_PARALLEL",
     "number of sequences generated at once (slots); -1 (llama-server's auto) = 4", KEPT),
    (("-n", "--predict", "--n-predict"), "n_predict", int, -1, "LLAMA_ARG_N_PREDICT",
     "default max tokens when a request sets none; -1 = until the context is full", KEPT),
    (("--chat-template-file",), "chat_template_file", str, None,
     "LLAMA_ARG_CHAT_TEMPLATE_FILE", "Jinja chat template to use instead of the model's",
     KEPT),
    (("--chat-template",), "chat_template", chat_template_value, None,
     "LLAMA_ARG_CHAT_TEMPLATE",
     "chat template instead of the model's: one of llama.cpp's built-in names (chatml, "
     "llama3, ...; an unknown name lists them) or a Jinja template string", KEPT),
    (("--jinja", "--no-jinja"), "jinja", Toggle("--no-jinja"), True, "LLAMA_ARG_JINJA",
     "render the Jinja chat template; --no-jinja uses llama.cpp's built-in format that "
     "the template's markers name (else chatml), and refuses tools, as llama-server does",
     MAPPED),
    (("--chat-template-kwargs",), "chat_template_kwargs", chat_template_kwargs, None,
     "LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
     "JSON object of chat-template variables for every request, e.g. "
     "'{\"enable_thinking\": false}'; a request's own chat_template_kwargs win key by key",
     KEPT),
    (("--tool-call-format",), "tool_call_format", str, None, "MLXCEL_TOOL_CALL_FORMAT",
     "tool-call format the model's answers are parsed with, by name (mlxcel-server plugins "
     "lists them); default: the model family's, else the one its chat template shows"),
    *REASONING_ROWS,
    (("-v", "--verbose", "--log-verbose"), "verbose", Toggle(), False, None,
     "add llama-server's __verbose debug field (the answer as /completion gives it) to "
     "OpenAI chat and completion answers", MAPPED),
    (("--log-format",), "log_format", choice("log_format", "json", "console"), "console",
     "MLXCEL_LOG_FORMAT",
     "log line format: json or console"),
    (("--plugins",), "plugins", str, None, "MLXCEL_PLUGINS",
     "comma-separated allow-list of plugin names to load (default: all installed)"),
    (("--disable-plugins",), "disable_plugins", str, None, "MLXCEL_DISABLE_PLUGINS",
     "comma-separated plugin names not to load"),
    (("-ub", "--ubatch-size", "--prefill-chunk-size"), "prefill_chunk_size", int, 512,
     "LLAMA_ARG_UBATCH",
     "physical batch: prompt tokens one forward pass prefills (a chunk; long prompts "
     "interleave with decoding); clamped to --batch-size as llama.cpp clamps it", MAPPED),
    (("-b", "--batch-size"), "batch_size", int, None, "LLAMA_ARG_BATCH",
     "logical batch: the most prompt tokens one engine step prefills over all its chunks; "
     "caps -ub and, on CUDA, the burst budget of 8 chunks a step (unset: no cap)", MAPPED),
    (("--max-queue-depth",), "max_queue_depth", int, 32, "MLXCEL_MAX_QUEUE_DEPTH",
     "requests that may wait for a slot; when full, new ones get 503 server_busy"),
    (("--grammar-compile-timeout",), "grammar_compile_timeout", float, 60.0,
     "MLXCEL_GRAMMAR_COMPILE_TIMEOUT",
     "seconds a response_format schema may take to compile before the request gets 400"),
    (("--grammar-cache-dir",), "grammar_cache_dir", path, None, "MLXCEL_GRAMMAR_CACHE_DIR",
     "directory where compiled response_format schemas and tool-call grammars persist "
     "across restarts (unset: ~/.cache/mlxcel/constraints); unwritable: memory only"),
    (("--grammar-cache-ram",), "grammar_cache_ram", byte_size, 1 << 30,
     "MLXCEL_GRAMMAR_CACHE_RAM",
     "bytes of compiled grammars kept in memory, the least recently used dropped first "
     "(e.g. 1G)"),
    (("--grammar-cache-disk",), "grammar_cache_disk", byte_size, 2 << 30,
     "MLXCEL_GRAMMAR_CACHE_DISK",
     "bytes of compiled grammars kept in --grammar-cache-dir, the least recently used "
     "pruned first (e.g. 2G)"),
    (("--grammar-compile-memory",), "grammar_compile_memory", byte_size, 4 << 30,
     "MLXCEL_GRAMMAR_COMPILE_MEMORY",
     "address space each grammar compile process may take; a schema that needs more gets "
     "400 (e.g. 4G)"),
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
    (("--responses-store-max-bytes",), "responses_store_max_bytes", byte_size, 64 << 20,
     "MLXCEL_RESPONSES_STORE_MAX_BYTES",
     "bytes (JSON) the stored responses may hold together, the least recently used dropped "
     "first; a response larger than this is not stored (e.g. 64M)"),
    (("--conversation-store-max-bytes",), "conversation_store_max_bytes", byte_size, 64 << 20,
     "MLXCEL_CONVERSATION_STORE_MAX_BYTES",
     "bytes (JSON) the conversations may hold together, the least recently used dropped "
     "first; a turn that would grow one conversation past this gets 400 (e.g. 64M)"),
    (("--slots", "--no-slots"), "slots", Toggle("--no-slots"), False,
     "LLAMA_ARG_ENDPOINT_SLOTS",
     "mount GET /slots (off by default here; llama-server mounts it by default)", KEPT),
    (("--metrics",), "metrics", Toggle(), False, "LLAMA_ARG_ENDPOINT_METRICS",
     "mount GET /metrics (Prometheus text format)", KEPT),
    (("--metrics-port",), "metrics_port", int, 0, "MLXCEL_METRICS_PORT",
     "serve metrics on this separate port instead (0 = off)"),
    (("--dtype",), "dtype", choice("dtype", "auto", "float32", "float16", "bfloat16"),
     "auto", "MLXCEL_DTYPE",
     "compute dtype: auto (float32 on MLX's CPU device with OpenBLAS or for a quantized "
     "model, else the checkpoint's own), float32, float16 or bfloat16"),
    (("--no-fast-blas",), "no_fast_blas", Toggle(), False, "MLXCEL_NO_FAST_BLAS",
     "on Linux CPU, do not preload an optimized BLAS (OpenBLAS) even when installed"),
    # sampling defaults (unset: the checkpoint's generation_config.json, then built-ins)
    (("--temp", "--temperature"), "temp", float, None, "LLAMA_ARG_TEMP",
     "default temperature (0 = greedy)", KEPT, "LLAMA_ARG_TEMPERATURE"),
    (("--top-k",), "top_k", int, None, "LLAMA_ARG_TOP_K", "default top-k (0 = off)", KEPT),
    (("--top-p",), "top_p", float, None, "LLAMA_ARG_TOP_P", "default top-p", KEPT),
    (("--min-p",), "min_p", float, None, "LLAMA_ARG_MIN_P", "default min-p (0 = off)", KEPT),
    (("--repeat-penalty",), "repeat_penalty", float, None, "LLAMA_ARG_REPEAT_PENALTY",
     "default repetition penalty (1.0 = off)", KEPT),
    (("--repeat-last-n",), "repeat_last_n", int, None, "LLAMA_ARG_REPEAT_LAST_N",
     "tokens the repetition penalty looks back over (-1 = whole context)", KEPT),
    (("--presence-penalty",), "presence_penalty", float, None, "LLAMA_ARG_PRESENCE_PENALTY",
     "default presence penalty", KEPT),
    (("--frequency-penalty",), "frequency_penalty", float, None,
     "LLAMA_ARG_FREQUENCY_PENALTY", "default frequency penalty", KEPT),
    (("--dry-multiplier",), "dry_multiplier", float, None, "LLAMA_ARG_DRY_MULTIPLIER",
     "default DRY multiplier (0 = off)", KEPT),
    (("--dry-base",), "dry_base", float, None, "LLAMA_ARG_DRY_BASE", "default DRY base", KEPT),
    (("--dry-allowed-length",), "dry_allowed_length", int, None,
     "LLAMA_ARG_DRY_ALLOWED_LENGTH", "default DRY allowed length", KEPT),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, None,
     "LLAMA_ARG_DRY_PENALTY_LAST_N", "default DRY look-back (0 or -1 = whole context)", KEPT),
    (("--xtc-probability",), "xtc_probability", float, None, "LLAMA_ARG_XTC_PROBABILITY",
     "default XTC probability (0 = off)", KEPT),
    (("--xtc-threshold",), "xtc_threshold", float, None, "LLAMA_ARG_XTC_THRESHOLD",
     "default XTC threshold", KEPT),
    (("-s", "--seed"), "seed", int, None, "LLAMA_ARG_SEED",
     "default seed (-1 or unset = random)", KEPT),
    (("--demo",), "demo", Toggle(), False, "MLXCEL_DEMO",
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
    (("--lean-decode",), "lean_decode", auto_on_off, "auto", "MLXCEL_LEAN_DECODE",
     "auto, 1 or 0: decode Llama/Qwen2/Qwen3-shaped models (and a family's own, e.g. "
     "Qwen-VL's) on [B, D] activations, without the sequence axis's views (auto: on with "
     "CUDA)"),
    (("--decode-attention",), "decode_attention",
     choice("decode_attention", "auto", "varlen", "grouped", "composed", "fused"), "auto",
     "MLXCEL_DECODE_ATTENTION",
     "attention for batches with padded rows (auto: varlen on CUDA, composed on MLX's CPU "
     "device, fused on Metal)"),
    (("--step-order",), "step_order", choice("step_order", "auto", "queue-first", "emit-first"),
     "auto", "MLXCEL_STEP_ORDER",
     "queue-first or emit-first: whether a decode step is queued on the device before the "
     "previous step's tokens go out, or after (auto: the device's choice)"),
    (("--shared-positions",), "shared_positions", on_off, "on", "MLXCEL_SHARED_POSITIONS",
     "on or off: decode a batch on one RoPE offset where the family and the model allow it"),
    (("--engine-trace",), "engine_trace", path, None, "MLXCEL_ENGINE_TRACE",
     "write one JSON line per engine loop turn that did work to this file (diagnosis)"),
    # several devices (docs/howto/distributed.md)
    (("--distributed",), "distributed", choice("distributed", "off", "tensor", "pipeline"),
     "off", "MLXCEL_DISTRIBUTED",
     "off, tensor or pipeline: serve one model over the ranks of mlx.launch (or "
     "`mlxcel-server launch`) on mx.distributed; rank 0 serves HTTP"),
    (("--distributed-backend",), "distributed_backend",
     choice("distributed_backend", "any", "ring", "jaccl", "nccl", "mpi"), "any",
     "MLXCEL_DISTRIBUTED_BACKEND",
     "mx.distributed backend for --distributed (any: the one the launcher set up)"),
    (("--distributed-timeout",), "distributed_timeout", float, 60.0,
     "MLXCEL_DISTRIBUTED_TIMEOUT",
     "seconds a distributed step may go without progress before the server fails (a rank "
     "hangs); a rank that dies fails it at once"),
    *CACHE_ROWS,
    *SIDE_ROWS,
    *MEDIA_ROWS,
    *SPEC_ROWS,
    # llama-server flags with no meaning on MLX: accepted, and named in one log line
    *((flags, IGNORED_DEST, type_, None, env, why, IGNORED)
      for flags, type_, env, why in IGNORED_ROWS),
]
OPTIONS: list[Option] = [Option(*row) for row in _ROWS]


def _env_default(env: str | None, type_: Any, default: Any, also: str | None = None) -> Any:
    """The row's default as its env twin (else its second twin ``also``) sets it (unset
    or empty: the table's default); a value its type refuses is a StartupError naming
    the variable."""
    if also and not os.environ.get(env or "") and os.environ.get(also):
        env = also
    raw = os.environ.get(env) if env else None
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
    for row in OPTIONS:
        if row.dest == dest:
            value = _env_default(row.env, row.type, row.default, row.env_also)
            return row.type(value) if isinstance(value, str) and row.type is not str else value
    raise KeyError(dest)


def _ignored_from_env() -> dict[str, str]:
    """The ignored rows' env twins that are set, as ``{canonical: "VAR=value"}`` (a value
    the row's type refuses stops the start, as for any twin)."""
    out = {}
    for row in OPTIONS:
        value = _env_default(row.env, row.type, None) if row.llama == IGNORED else None
        if value is not None:
            out[canonical(row.flags)] = f"{row.env}={value}"
    return out


def _add(parser: argparse.ArgumentParser, row: Option) -> None:
    twin = f" [env: {row.env}{', ' + row.env_also if row.env_also else ''}]" if row.env else ""
    if row.llama == IGNORED:
        switch = isinstance(row.type, Toggle)
        parser.add_argument(*row.flags, dest=IGNORED_DEST, action=IgnoredAction,
                            key=canonical(row.flags), type=None if switch else row.type,
                            nargs=0 if switch else getattr(row.type, "nargs", None),
                            help=f"ignored on MLX: {row.help}{twin}")
        return
    kwargs: dict[str, Any] = {"dest": row.dest, "help": f"{row.help}{twin}",
                              "default": _env_default(row.env, row.type, row.default,
                                                      row.env_also)}
    if isinstance(row.type, Toggle):  # a switch: its spellings set it; the env twin, the default
        kwargs.update(action=ToggleAction, toggle=row.type)
    else:
        kwargs.update(type=row.type, choices=getattr(row.type, "choices", None),
                      nargs=getattr(row.type, "nargs", None))
    parser.add_argument(*row.flags, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The server's parser; abbreviations are refused, as llama-server refuses them."""
    parser = _ServerParser(
        prog="mlxcel-server",
        description="LLM inference server on MLX. `mlxcel-server plugins` lists plugins.",
        formatter_class=HelpFormatter, allow_abbrev=False)
    for row in OPTIONS:
        _add(parser, row)
    parser.set_defaults(**{IGNORED_DEST: _ignored_from_env()})
    parser.add_argument("--version", action="version", version=f"mlxcel {__version__}")
    return parser


def ignored_notes(settings: Any) -> list[str]:
    """What the startup log line ``flags_ignored`` lists: each ignored flag as given and
    each pending feature asked for, with the reason."""
    notes = []
    for row in OPTIONS:
        if row.llama == IGNORED and canonical(row.flags) in settings.ignored_flags:
            notes.append(f"{settings.ignored_flags[canonical(row.flags)]}: {row.help}")
        elif row.llama == PENDING and getattr(settings, row.dest) != row.default:
            notes.append(f"{row.flags[-1]}: {row.help}")
    return notes
