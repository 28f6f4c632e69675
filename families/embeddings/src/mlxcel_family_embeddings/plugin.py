"""The entry point: register the ``embeddings`` family. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
checkpoint checks (``detect``, no MLX), the loader and the task runners are
``"module:attr"`` strings, imported when a checkpoint of this family is served.
"""

from mlxcel import hookimpl
from mlxcel.families.api import Family

NAME = "embeddings"
# encoders, and the decoders whose model_type a chat model shares (``check`` tells them
# apart: an embedder or a reranker, never a chat model)
MODEL_TYPES = ("bert", "modernbert", "xlm-roberta", "xlm_roberta", "qwen3", "gemma3_text")


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name=NAME,
        model_types=MODEL_TYPES,
        tasks={"embed": "mlxcel_family_embeddings.runners:embedder",
               "rerank": "mlxcel_family_embeddings.runners:reranker"},
        load="mlxcel_family_embeddings.load:load",
        check="mlxcel_family_embeddings.detect:check",
        tasks_of="mlxcel_family_embeddings.detect:tasks_of",
    ))
