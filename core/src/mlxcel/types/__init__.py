"""Internal frozen msgspec structs shared by dialects and the engine."""

from mlxcel.types.events import FinishReason, GenerationEvent, TokenLogprob, Usage
from mlxcel.types.requests import GenerationRequest, LoopPolicy, SamplingParams

__all__ = ["FinishReason", "GenerationEvent", "GenerationRequest", "LoopPolicy", "SamplingParams",
           "TokenLogprob", "Usage"]
