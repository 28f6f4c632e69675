"""llama-server's flags that have no meaning on MLX, with why: rows of the options table
(``mlxcel.options``) whose values are accepted, kept in ``Settings.ignored_flags`` and
named in one startup line (``flags_ignored``), so that a llama-server command line starts
as it is. A flag in neither table stays an unknown flag."""

from __future__ import annotations

from typing import Any

from mlxcel.option_types import Toggle, choice, maybe_text, text

KV_TYPES = choice("cache_type", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl",
                  "q5_0", "q5_1")
ON_DEVICE = ("MLX runs the whole model on one device (unified memory on Apple silicon, "
             "or the one CUDA GPU): there is nothing to offload, split or place")
THREADS = ("MLX schedules its own work; on Linux CPU, OpenBLAS sizes its threads "
           "(OPENBLAS_NUM_THREADS)")
LOADING = ("MLX reads the safetensors into its own buffers: there is no memory map to "
           "lock or turn off")
LOGS = "one structlog line per event; --log-format picks json or console"
KV_DTYPE = ("the KV cache holds the model's compute dtype (--dtype); quantized KV caches "
            "are not offered")

# (flags, type, env twin or None, why it means nothing here)
IGNORED_ROWS: tuple[tuple[Any, ...], ...] = (
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), text, "LLAMA_ARG_N_GPU_LAYERS", ON_DEVICE),
    (("-sm", "--split-mode"), text, "LLAMA_ARG_SPLIT_MODE", ON_DEVICE),
    (("-ts", "--tensor-split"), text, "LLAMA_ARG_TENSOR_SPLIT", ON_DEVICE),
    (("-mg", "--main-gpu"), text, "LLAMA_ARG_MAIN_GPU", ON_DEVICE),
    (("-dev", "--device"), text, "LLAMA_ARG_DEVICE", ON_DEVICE),
    (("-cmoe", "--cpu-moe"), Toggle(), "LLAMA_ARG_CPU_MOE", ON_DEVICE),
    (("-ncmoe", "--n-cpu-moe"), text, "LLAMA_ARG_N_CPU_MOE", ON_DEVICE),
    (("-ot", "--override-tensor"), text, "LLAMA_ARG_OVERRIDE_TENSOR", ON_DEVICE),
    (("-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"), Toggle("-nkvo", "--no-kv-offload"),
     "LLAMA_ARG_KV_OFFLOAD", ON_DEVICE),
    (("-fit", "--fit"), maybe_text, "LLAMA_ARG_FIT",
     "each request's memory is checked against the device's budget instead "
     "(--request-memory-budget)"),
    (("-t", "--threads"), text, "LLAMA_ARG_THREADS", THREADS),
    (("-tb", "--threads-batch"), text, "LLAMA_ARG_THREADS_BATCH", THREADS),
    (("-C", "--cpu-mask"), text, None, THREADS),
    (("-Cr", "--cpu-range"), text, None, THREADS),
    (("--cpu-strict",), text, None, THREADS),
    (("--prio",), text, None, THREADS),
    (("--poll",), text, None, THREADS),
    (("--numa",), text, "LLAMA_ARG_NUMA", THREADS),
    (("--mlock",), Toggle(), "LLAMA_ARG_MLOCK", LOADING),
    (("--mmap", "--no-mmap"), Toggle("--no-mmap"), "LLAMA_ARG_NO_MMAP", LOADING),
    (("-fa", "--flash-attn"), maybe_text, "LLAMA_ARG_FLASH_ATTN",
     "the attention kernel is chosen per device (--decode-attention)"),
    (("-ctk", "--cache-type-k"), KV_TYPES, "LLAMA_ARG_CACHE_TYPE_K", KV_DTYPE),
    (("-ctv", "--cache-type-v"), KV_TYPES, "LLAMA_ARG_CACHE_TYPE_V", KV_DTYPE),
    (("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"),
     Toggle("-no-kvu", "--no-kv-unified"), "LLAMA_ARG_KV_UNIFIED",
     "each slot's KV rows grow with its sequence inside one batch cache: there is no "
     "fixed buffer to share or split"),
    (("--swa-full",), Toggle(), "LLAMA_ARG_SWA_FULL",
     "sliding-window layers keep mlx-lm's rotating caches"),
    (("--cache-reuse",), text, "LLAMA_ARG_CACHE_REUSE",
     "the prompt cache reuses a request's longest cached prefix; chunks are never "
     "shifted inside the KV cache"),
    (("-cb", "--cont-batching", "-nocb", "--no-cont-batching"),
     Toggle("-nocb", "--no-cont-batching"), "LLAMA_ARG_CONT_BATCHING",
     "the engine always batches continuously (requests join between decode steps); "
     "-np 1 serves one request at a time"),
    (("--context-shift", "--no-context-shift"), Toggle("--no-context-shift"),
     "LLAMA_ARG_CONTEXT_SHIFT",
     "a generation that fills its context ends with finish_reason length; nothing is "
     "shifted out"),
    (("--warmup", "--no-warmup"), Toggle("--no-warmup"), None,
     "warm-up is the device's: CUDA runs every prefill shape once at startup, other "
     "devices need none"),
    (("-sps", "--slot-prompt-similarity"), text, None,
     "a request takes any free slot; the prompt cache, not the slot, keeps prefixes"),
    (("-dt", "--defrag-thold"), text, "LLAMA_ARG_DEFRAG_THOLD",
     "the KV cache never fragments (the flag is deprecated in llama.cpp too)"),
    (("--props",), Toggle(), "LLAMA_ARG_ENDPOINT_PROPS",
     "settings are fixed at startup: GET /props answers, POST /props is not served"),
    (("--webui", "--no-webui"), Toggle("--no-webui"), None, "no web UI is served"),
    (("--log-colors",), maybe_text, "LLAMA_ARG_LOG_COLORS", LOGS),
    (("--log-timestamps", "--no-log-timestamps"), Toggle("--no-log-timestamps"),
     "LLAMA_ARG_LOG_TIMESTAMPS", LOGS),
    (("--log-prefix", "--no-log-prefix"), Toggle("--no-log-prefix"),
     "LLAMA_ARG_LOG_PREFIX", LOGS),
    (("-lv", "--verbosity", "--log-verbosity"), text, "LLAMA_ARG_LOG_VERBOSITY", LOGS),
)
