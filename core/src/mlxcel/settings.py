"""Server settings: one frozen struct, filled by the CLI (flags + env twins)."""

from __future__ import annotations

import os

import msgspec

SETTINGS_ENV = "MLXCEL_SETTINGS_JSON"  # how the CLI hands settings to the Granian worker


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    alias: str | None = None
    demo: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    ctx_size: int = 0
    parallel: int = 4
    n_predict: int = -1
    chat_template_file: str | None = None
    log_format: str = "console"
    plugins: str | None = None
    disable_plugins: str | None = None
    prefill_chunk_size: int = 512
    max_queue_depth: int = 32
    slots: bool = False
    metrics: bool = False
    metrics_port: int = 0
    dtype: str = "auto"
    no_fast_blas: bool = False

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get(SETTINGS_ENV)
        return msgspec.json.decode(raw, type=cls) if raw else cls()
