"""Builtin plugin: the generic text family, driving mlx-lm's own model classes."""

from __future__ import annotations

from mlxcel.families.api import Family
from mlxcel.hookspecs import hookimpl

# model_types whose mlx-lm implementation uses the standard (trimmable) KV cache; each of
# them reads cache.offset only as its RoPE offset (relative_positions).
TEXT_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "gemma",
    "gemma2", "starcoder2", "granite", "olmo2", "internlm3", "exaone",
)


@hookimpl
def mlxcel_register_families(registry) -> None:
    registry.register(
        "mlx-lm-text",
        Family(
            name="mlx-lm-text",
            model_types=TEXT_MODEL_TYPES,
            loader="mlxcel.builtin.text_loader:load",
            capabilities=frozenset({"text"}),
            supports_batching=True,
            relative_positions=True,
        ),
    )
