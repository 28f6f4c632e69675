"""Internal frozen msgspec structs shared by dialects and the engine."""

from mlxcel.types.deltas import (
    ContentDelta,
    Delta,
    Finish,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from mlxcel.types.events import (
    FinishReason,
    GenerationEvent,
    PromptProgress,
    TokenLogprob,
    Usage,
)
from mlxcel.types.media import MediaBlob
from mlxcel.types.requests import (
    GenerationRequest,
    LoopPolicy,
    ReasoningLimit,
    SamplingParams,
)

__all__ = [
    "ContentDelta", "Delta", "Finish", "FinishReason", "GenerationEvent", "GenerationRequest",
    "LoopPolicy", "MediaBlob", "PromptProgress", "ReasoningDelta", "ReasoningLimit", "SamplingParams",
    "TokenLogprob", "ToolCallArguments", "ToolCallEnd", "ToolCallStart", "Usage",
]
