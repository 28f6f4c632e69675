"""The prompt cache's rows of the options table (``mlxcel.options``): on or off, its
memory budget, its checkpoints for models whose caches cannot be cut back, and its disk
tier (``mlxcel.engine.cache``). Row format as the table's: (flags, dest, type, default,
env twin, help[, llama kind[, second env twin]]).
"""

from __future__ import annotations

from typing import Any

from mlxcel.option_types import KEPT, MAPPED, Toggle, byte_size, path

CACHE_ROWS: list[tuple[Any, ...]] = [
    (("--no-cache-prompt", "--cache-prompt"), "no_cache_prompt", Toggle("--cache-prompt"),
     False, "LLAMA_ARG_NO_CACHE_PROMPT", "turn the prompt (prefix) cache off server-wide",
     KEPT),
    (("-cram", "--cache-ram"), "cache_ram", int, 2048, "LLAMA_ARG_CACHE_RAM",
     "prompt cache capacity in MiB", KEPT),
    (("--prompt-cache-capacity-bytes",), "prompt_cache_capacity_bytes", int, 0,
     "MLXCEL_PROMPT_CACHE_CAPACITY_BYTES",
     "prompt cache capacity in bytes (overrides --cache-ram)"),
    (("--prompt-cache-max-entries",), "prompt_cache_max_entries", int, 1024,
     "MLXCEL_PROMPT_CACHE_MAX_ENTRIES", "most entries the prompt cache keeps"),
    (("--prompt-cache-ttl",), "prompt_cache_ttl", float, 3600.0, "MLXCEL_PROMPT_CACHE_TTL",
     "seconds a prompt cache entry lives"),
    (("--cache-checkpoint-interval",), "cache_checkpoint_interval", int, 256,
     "MLXCEL_CACHE_CHECKPOINT_INTERVAL",
     "models with recurrent or sliding-window layers: also checkpoint a long prompt every "
     "N blocks of 16 tokens (0 = only at message boundaries and the prompt's end)"),
    (("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "ctx_checkpoints", int, 8,
     "LLAMA_ARG_CTX_CHECKPOINTS",
     "most checkpoints one prompt cache entry keeps (the least valuable dropped first)",
     MAPPED),
    (("--cache-disk-dir",), "cache_disk_dir", path, None, "MLXCEL_CACHE_DISK_DIR",
     "directory where prompt cache entries evicted from memory persist, across restarts "
     "(unset: no disk tier)"),
    (("--cache-disk-bytes",), "cache_disk_bytes", byte_size, 16 << 30,
     "MLXCEL_CACHE_DISK_BYTES",
     "bytes the prompt cache may keep in --cache-disk-dir, the least recently used "
     "deleted first (e.g. 16G)"),
]
