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
NO_UI = "no web UI is served (nor its static files, tools or MCP proxy)"
ROUTER = "one process serves one model (-m); there is no router mode"
MEDIA = ("MLX checkpoints carry their own vision tower (mlxcel-family-vlm): there is no "
         "projector file, and it runs where the model runs")

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
    (("-Cb", "--cpu-mask-batch"), text, None, THREADS),
    (("-Crb", "--cpu-range-batch"), text, None, THREADS),
    (("--cpu-strict-batch",), text, None, THREADS),
    (("--prio-batch",), text, None, THREADS),
    (("--poll-batch",), text, None, THREADS),
    (("--perf", "--no-perf"), Toggle("--no-perf"), "LLAMA_ARG_PERF",
     "timings are always measured and reported (timings, /metrics)"),
    (("-bs", "--backend-sampling"), Toggle(), "LLAMA_ARG_BACKEND_SAMPLING",
     "sampling always runs on the device, inside the engine's step"),
    (("--rpc",), text, "LLAMA_ARG_RPC",
     "no RPC backends: --distributed splits one model over mx.distributed ranks"),
    (("--no-host",), Toggle(), "LLAMA_ARG_NO_HOST", ON_DEVICE),
    (("--op-offload", "--no-op-offload"), Toggle("--no-op-offload"), None, ON_DEVICE),
    (("--moe-cache-mib",), text, "LLAMA_ARG_MOE_CACHE_MIB", ON_DEVICE),
    (("-ncffn", "--n-cpu-ffn"), text, "LLAMA_ARG_N_CPU_FFN", ON_DEVICE),
    (("-fitt", "--fit-target"), text, "LLAMA_ARG_FIT_TARGET",
     "each request's memory is checked against the device's budget instead "
     "(--request-memory-budget)"),
    (("-fitc", "--fit-ctx"), text, "LLAMA_ARG_FIT_CTX",
     "the context is -c (or the model's own): nothing fits it to memory"),
    (("--numa",), text, "LLAMA_ARG_NUMA", THREADS),
    (("--mlock",), Toggle(), "LLAMA_ARG_MLOCK", LOADING),
    (("--mmap", "--no-mmap"), Toggle("--no-mmap"), "LLAMA_ARG_NO_MMAP", LOADING),
    (("-lm", "--load-mode"), text, "LLAMA_ARG_LOAD_MODE", LOADING),
    (("-lzm", "--lazy-mode"), text, "LLAMA_ARG_LAZY_MODE", LOADING),
    (("--repack", "-nr", "--no-repack"), Toggle("-nr", "--no-repack"), "LLAMA_ARG_REPACK",
     "MLX computes on the checkpoint's own layout: there is no CPU repacking"),
    (("--check-tensors",), Toggle(), None,
     "safetensors are read as MLX arrays; no extra pass checks their values"),
    (("-fa", "--flash-attn"), maybe_text, "LLAMA_ARG_FLASH_ATTN",
     "the attention kernel is chosen per device (--decode-attention)"),
    (("-ctk", "--cache-type-k"), KV_TYPES, "LLAMA_ARG_CACHE_TYPE_K", KV_DTYPE),
    (("-ctv", "--cache-type-v"), KV_TYPES, "LLAMA_ARG_CACHE_TYPE_V", KV_DTYPE),
    (("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), KV_TYPES,
     "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", KV_DTYPE),
    (("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), KV_TYPES,
     "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", KV_DTYPE),
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
     "warm-up is the device's: CUDA runs what a lone request meets at startup and the "
     "other prefill shapes between served steps; other devices need none"),
    (("-sps", "--slot-prompt-similarity"), text, None,
     "a request takes any free slot; the prompt cache, not the slot, keeps prefixes"),
    (("-dt", "--defrag-thold"), text, "LLAMA_ARG_DEFRAG_THOLD",
     "the KV cache never fragments (the flag is deprecated in llama.cpp too)"),
    (("--props",), Toggle(), "LLAMA_ARG_ENDPOINT_PROPS",
     "settings are fixed at startup: GET /props answers, POST /props is not served"),
    (("--ui", "--webui", "--no-ui", "--no-webui"), Toggle("--no-ui", "--no-webui"),
     "LLAMA_ARG_UI", NO_UI),
    (("--ui-config", "--webui-config"), text, "LLAMA_ARG_UI_CONFIG", NO_UI),
    (("--ui-config-file", "--webui-config-file"), text, "LLAMA_ARG_UI_CONFIG_FILE", NO_UI),
    (("--ui-mcp-proxy", "--webui-mcp-proxy", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
     Toggle("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), "LLAMA_ARG_UI_MCP_PROXY", NO_UI),
    (("--path",), text, "LLAMA_ARG_STATIC_PATH", NO_UI),
    (("--tools",), text, "LLAMA_ARG_TOOLS", NO_UI),
    (("--tools-runtime",), text, "LLAMA_ARG_TOOLS_RUNTIME", NO_UI),
    (("--mcp-servers-config",), text, "LLAMA_ARG_MCP_SERVERS_CONFIG", NO_UI),
    (("--mcp-servers-json",), text, "LLAMA_ARG_MCP_SERVERS_JSON", NO_UI),
    (("-ag", "--agent", "-no-ag", "--no-agent"), Toggle("-no-ag", "--no-agent"),
     "LLAMA_ARG_AGENT", NO_UI),
    (("--models-dir",), text, "LLAMA_ARG_MODELS_DIR", ROUTER),
    (("--models-preset",), text, "LLAMA_ARG_MODELS_PRESET", ROUTER),
    (("--models-max",), text, "LLAMA_ARG_MODELS_MAX", ROUTER),
    (("--models-autoload", "--no-models-autoload"), Toggle("--no-models-autoload"),
     "LLAMA_ARG_MODELS_AUTOLOAD", ROUTER),
    (("--sleep-idle-seconds",), text, None, "the model stays loaded while the server runs"),
    (("--reuse-port",), Toggle(), "LLAMA_ARG_REUSE_PORT",
     "a port another process listens on refuses to start (shared ports split requests)"),
    (("--sse-ping-interval",), text, "LLAMA_ARG_SSE_PING_INTERVAL",
     "streams send no keep-alive pings; --idle-timeout and --timeout bound a connection"),
    (("--slot-save-path",), text, "LLAMA_ARG_SLOT_SAVE_PATH",
     "slot save and restore are not served; --cache-disk-dir keeps prompt prefixes on disk"),
    (("--cache-idle-slots", "--no-cache-idle-slots"), Toggle("--no-cache-idle-slots"),
     "LLAMA_ARG_CACHE_IDLE_SLOTS", "every finished answer's prefix goes to the prompt cache"),
    (("-cms", "--checkpoint-min-step"), text, "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
     "the prompt cache checkpoints every --cache-checkpoint-interval blocks"),
    (("--keep",), text, None, "nothing is shifted out of a full context (see --context-shift)"),
    (("-r", "--reverse-prompt"), text, None, "interactive mode only; use a request's stop"),
    (("-e", "--escape", "--no-escape"), Toggle("--no-escape"), None,
     "prompts arrive as JSON strings over HTTP: there is no command-line prompt to unescape"),
    (("-mm", "--mmproj"), text, "LLAMA_ARG_MMPROJ", MEDIA),
    (("-mmu", "--mmproj-url"), text, "LLAMA_ARG_MMPROJ_URL", MEDIA),
    (("--mmproj-auto", "--no-mmproj", "--no-mmproj-auto"),
     Toggle("--no-mmproj", "--no-mmproj-auto"), "LLAMA_ARG_MMPROJ_AUTO", MEDIA),
    (("--mmproj-offload", "--no-mmproj-offload"), Toggle("--no-mmproj-offload"),
     "LLAMA_ARG_MMPROJ_OFFLOAD", MEDIA),
    (("-mmdev", "--mmproj-device"), text, "MTMD_BACKEND_DEVICE", MEDIA),
    (("--mtmd-batch-max-tokens",), text, "LLAMA_ARG_MTMD_BATCH_MAX_TOKENS",
     "each image's tower runs once, cached by digest (--vision-cache-size)"),
    (("--log-prompts-dir",), text, None, LOGS),
    (("--log-disable",), Toggle(), None, LOGS),
    (("--log-file",), text, "LLAMA_ARG_LOG_FILE", LOGS + "; redirect its output to a file"),
    (("--log-jsonl", "--no-log-jsonl"), Toggle("--no-log-jsonl"), "LLAMA_ARG_LOG_JSONL",
     LOGS),
    (("--log-colors",), maybe_text, "LLAMA_ARG_LOG_COLORS", LOGS),
    (("--log-timestamps", "--no-log-timestamps"), Toggle("--no-log-timestamps"),
     "LLAMA_ARG_LOG_TIMESTAMPS", LOGS),
    (("--log-prefix", "--no-log-prefix"), Toggle("--no-log-prefix"),
     "LLAMA_ARG_LOG_PREFIX", LOGS),
    (("-lv", "--verbosity", "--log-verbosity"), text, "LLAMA_ARG_LOG_VERBOSITY", LOGS),
)
