"""Dialect-neutral embedding and reranking: inputs checked and tokenized on the HTTP side,
run on the engine's job lane by the side model's runner (``mlxcel.families.tasks``), and
vectors post-processed in NumPy (``vectors``). The dialects only shape the wire."""

from __future__ import annotations

from typing import Any

from mlxcel.errors import NoModelForRoute
from mlxcel.families.registry import TASK_DISTRIBUTIONS

# task -> (what it needs, the flag that loads it); the distribution: TASK_DISTRIBUTIONS
NEEDS = {"embed": ("an embedding model", "--embedding-model"),
         "rerank": ("a reranking model", "--reranker-model"),
         "transcribe": ("a speech-to-text model (Whisper)", "--stt-model"),
         "speak": ("a text-to-speech model (Kokoro)", "--tts-model")}


def side_model(ctx: Any, task: str, path: str) -> Any:
    """The side engine serving ``task``, or a 501 naming the flag that loads one and the
    distribution that serves it."""
    side = ctx.side(task)
    if side is None:
        what, flag = NEEDS[task]
        distribution = TASK_DISTRIBUTIONS[task]
        raise NoModelForRoute(
            f"POST {path} needs {what}, and this server has none loaded; start it with "
            f"{flag} PATH_OR_HF_ID (pip install {distribution}); it serves "
            f"{', '.join(ctx.served_routes())}")
    return side
