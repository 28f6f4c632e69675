"""Builtin plugin: the text families, driving mlx-lm's own model classes.

Two families share mlx-lm's loader (``mlxcel.families.text``, the kit a separately
installed text family uses too); both decline embedders and classifiers, whose model_type
may be a chat model's:

* ``mlx-lm-text`` lists the model_types verified for the shared-position fast path: their
  mlx-lm implementation uses the standard KV cache and reads ``cache.offset`` only as its
  RoPE offset (``relative_positions``).
* ``mlx-lm-generic`` takes (``check``) every other model_type the installed mlx-lm implements,
  resolved through mlx-lm's own module lookup and remapping (``mlx_lm_types``), so a model
  ``mlx_lm.server`` serves is served here too. It lists none, so a separately installed
  family that names one of those types takes precedence over it.
"""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.families import text
from mlxcel.families.api import Family

TEXT_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "gemma",
    "gemma2", "starcoder2", "granite", "olmo2", "internlm3", "exaone",
)


@hookimpl
def mlxcel_register_families(registry) -> None:
    registry.add(Family(name="mlx-lm-text", model_types=TEXT_MODEL_TYPES, tasks=text.TASKS,
                        load=text.LOAD, check=text.CHECK, relative_positions=True))
    registry.add(Family(name="mlx-lm-generic", tasks=text.TASKS, load=text.LOAD,
                        check="mlxcel.builtin.mlx_lm_types:check"))
