"""Server settings: one frozen struct, filled by the CLI from the options table
(``mlxcel.options``: flags and their env twins), and the engine's share of it.

The CLI hands the settings to the Granian worker through ``SETTINGS_ENV`` and the worker
hands a fatal error back through the file named by ``FAILURE_ENV``; these two variables are
process plumbing between the CLI and its worker, not settings. This module is the one place
besides the options table that touches the environment (other programs' variables are
``mlxcel.backend.library_env``'s).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from mlxcel.types import LoopPolicy

# side task -> the Settings toggle that restricts the process to it (--embeddings, ...)
MODES = {"embed": "embeddings", "rerank": "reranking"}
# side task -> its model's flag (mlxcel.engines)
SIDE_FLAGS = (("embed", "embedding_model"), ("rerank", "reranker_model"),
              ("transcribe", "stt_model"), ("speak", "tts_model"))
SETTINGS_ENV = "MLXCEL_SETTINGS_JSON"  # how the CLI hands settings to the Granian worker
FAILURE_ENV = "MLXCEL_FAILURE_FILE"  # where the worker leaves a fatal error for the CLI


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    alias: str | None = None
    demo: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    api_key_file: str | None = None
    allowed_hosts: str | None = None
    cors_origins: str = "localhost"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    threads_http: int = -1
    max_connections: int = 2048
    idle_timeout: float = 30.0
    body_timeout: float = 60.0
    timeout: float = 600.0
    shutdown_timeout: float = 30.0
    ctx_size: int = 0
    parallel: int = 4
    n_predict: int = -1
    chat_template_file: str | None = None
    chat_template: str | None = None  # a built-in name or Jinja text (mlxcel.model.chat_templates)
    jinja: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tool_call_format: str | None = None
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    prompt_lookup: str = "auto"  # speculative decoding (mlxcel.options_spec)
    draft_max: int = 16
    draft_min: int = 0
    model_draft: str | None = None
    draft_force: bool = False
    draft_kind: str | None = None
    draft_block_size: int = 0
    spec_type: str | None = None
    reasoning: str = "auto"  # --reasoning: on/off set enable_thinking (mlxcel.options)
    reasoning_effort: str = "default"  # set: the reasoning_effort template variable
    tags: str | None = None  # --tags: shown in /v1/models
    verbose: bool = False  # -v: the __verbose debug field on OpenAI answers
    log_format: str = "console"
    plugins: str | None = None
    disable_plugins: str | None = None
    prefill_chunk_size: int = 512
    batch_size: int | None = None
    max_queue_depth: int = 32
    grammar_compile_timeout: float = 60.0  # seconds; mlxcel.engine.constraints
    grammar_cache_dir: str | None = None  # None: constraints.default_cache_dir()
    grammar_cache_ram: int = 1 << 30  # bytes; constraints.CacheBudget.memory_bytes
    grammar_cache_disk: int = 2 << 30  # bytes; constraints.CacheBudget.disk_bytes
    grammar_compile_memory: int = 4 << 30  # bytes; constraints.CacheBudget.compile_bytes
    responses_store_max_entries: int = 1024  # mlxcel.dialects.responses.store
    responses_store_ttl_secs: float = 3600.0
    conversation_store_max_entries: int = 256
    conversation_store_ttl_secs: float = 3600.0
    responses_store_max_bytes: int = 64 << 20
    conversation_store_max_bytes: int = 64 << 20
    slots: bool = False
    metrics: bool = False
    metrics_port: int = 0
    dtype: str = "auto"
    no_fast_blas: bool = False
    no_cache_prompt: bool = False
    cache_ram: int = 2048
    prompt_cache_capacity_bytes: int = 0
    prompt_cache_max_entries: int = 1024
    prompt_cache_ttl: float = 3600.0
    cache_checkpoint_interval: int = 256  # blocks; mlxcel.engine.cache.capture
    ctx_checkpoints: int = 8  # per prompt cache entry
    cache_disk_dir: str | None = None  # None: no disk tier
    cache_disk_bytes: int = 16 << 30
    # sampling defaults from flags (None: not given)
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    seed: int | None = None
    # engine tuning and diagnosis (None: the engine's per-device default)
    request_memory_budget: int | None = None
    loop_detection: LoopPolicy | None = None
    switch_interval: float | None = None
    fuse_projections: bool | None = None
    lean_decode: bool | None = None
    decode_attention: str = "auto"
    step_order: str = "auto"
    shared_positions: bool = True
    engine_trace: str | None = None
    distributed: str = "off"  # mlxcel.engine.distributed
    distributed_backend: str = "any"
    distributed_timeout: float = 60.0
    # side models (mlxcel.engines): embeddings and reranking
    embedding_model: str | None = None
    reranker_model: str | None = None
    embeddings: bool = False  # serve embeddings only
    reranking: bool = False  # serve reranking only
    pooling: str | None = None  # None: the checkpoint's
    embd_normalize: int = 2
    embedding_batch_size: int = 16
    embedding_max_length: int = 0  # 0: the model's
    embedding_queue_depth: int = 8
    embedding_request_timeout_secs: float = 120.0
    rerank_batch_size: int = 8
    stt_model: str | None = None  # transcribe (mlxcel.families.speech)
    tts_model: str | None = None  # speak
    image_model: str | None = None  # generate_image: not built yet (refused at startup)
    audio_queue_depth: int = 8
    audio_request_timeout_secs: float = 120.0
    # media input (mlxcel.options_media): local roots, the address guard, the limits
    media_path: tuple[str, ...] = ()  # resolved roots; empty: local media files refused
    allow_private_media_urls: bool = False  # MLXCEL_ALLOW_PRIVATE_MEDIA_URLS
    max_image_payload_size: int = 64 << 20  # bytes per media part
    max_images: int = 16  # per request
    max_image_width: int = 16384
    max_image_height: int = 16384
    vision_cache_size: int = 20  # images' features kept per model, by digest
    # llama-server flags with no meaning on MLX, as given: {"--n-gpu-layers": "-ngl 99"}
    ignored_flags: dict[str, str] = {}

    def aliases(self) -> tuple[str, ...]:
        """``--alias a,b``: every name the model answers to, the first one shown."""
        return tuple(a.strip() for a in (self.alias or "").split(",") if a.strip())

    def tag_list(self) -> list[str]:
        """``--tags a,b``: the model's tags as ``/v1/models`` shows them."""
        return [t.strip() for t in (self.tags or "").split(",") if t.strip()]

    def hosts(self) -> tuple[str, ...]:
        """``--host a,b``: every address the server listens on, the first one Granian's."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip()) or ("127.0.0.1",)

    def api_keys(self) -> tuple[str, ...]:
        """``--api-key k1,k2`` (or the file's lines, joined so): a request may send any."""
        return tuple(k.strip() for k in (self.api_key or "").split(",") if k.strip())

    def prefill_chunk(self) -> int:
        """The engine's chunk: ``-ub`` clamped to ``-b``, as llama.cpp clamps n_ubatch."""
        return min(self.prefill_chunk_size, self.batch_size or self.prefill_chunk_size)

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get(SETTINGS_ENV)
        return msgspec.json.decode(raw, type=cls) if raw else cls()


def failure_file() -> str | None:
    """In the Granian worker: where to leave a fatal error for the CLI (None outside it)."""
    return os.environ.get(FAILURE_ENV) or None


def hand_to_worker(settings: Settings, failure: str) -> None:
    """In the CLI, before Granian starts its worker: the settings, and the file where the
    worker leaves a fatal error, travel through the environment the worker inherits."""
    os.environ[SETTINGS_ENV] = settings.to_env()
    os.environ[FAILURE_ENV] = failure
