"""Internal frozen msgspec structs shared by dialects and the engine."""

from mlxcel.types.events import FinishReason, GenerationEvent, Usage
from mlxcel.types.requests import GenerationRequest, SamplingParams

__all__ = ["FinishReason", "GenerationEvent", "GenerationRequest", "SamplingParams", "Usage"]
