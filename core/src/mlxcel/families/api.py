"""Model family contract: which checkpoints a family loads and what it can do."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

CAPABILITIES = frozenset(
    {"text", "vision", "audio_in", "transcription", "speech", "embedding", "rerank",
     "image_generation"}
)


class LoopPolicy(msgspec.Struct, frozen=True):
    """Tail n-gram loop detection defaults a family asks for."""

    min_pattern_size: int = 1
    max_pattern_size: int = 20
    min_count: int = 4


class ReasoningSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a model marks its reasoning in its output, for the chat layer's reasoning split
    (``mlxcel.chat.reasoning``): the text between the markers goes to the answer's
    reasoning (``reasoning_content``), never to its content or its tool parser.

    ``style`` ``"block"``: ``open`` ... ``close`` around the reasoning (``<think>`` /
    ``</think>``). ``label``: a channel name the model writes right after ``open`` (Gemma 4
    writes ``<|channel>thought`` and a newline); it and that newline are not reasoning text.

    ``style`` ``"harmony"``: the answer is a run of messages, each a header up to
    ``<|message|>`` and a body up to an end marker (gpt-oss); a body on the ``label``
    channel (``analysis``) is reasoning, and ``open``/``close`` (``<|channel|>`` /
    ``<|end|>``) are the channel and end markers. Other messages' headers reach the tool
    parser, never the content.

    When the rendered prompt already opens a block (its last ``open`` after its last
    ``close``, as templates that end the generation prompt with ``<think>`` do), the answer
    starts inside it; no field says so, because the prompt shows it.
    """

    open: str
    close: str
    label: str = ""
    style: str = "block"


class Family(msgspec.Struct, frozen=True, kw_only=True):
    """A model family plugin.

    ``loader`` is a ``"module:attr"`` string naming ``load(path, options) -> LoadedModel``;
    it is imported only when a checkpoint of this family is loaded.

    ``accepts``: a ``"module:attr"`` string naming ``accepts(model_type, config) -> bool``,
    for a family whose types are an open set (every type a library implements). It is asked
    only about a ``model_type`` that no family lists in ``model_types``, so a family naming
    a type always takes precedence over one that merely accepts it. It runs in the startup
    check before the server forks, so its module must not import MLX.

    ``relative_positions``: the family's models read ``cache.offset`` only as the RoPE
    offset, so the engine may give every row of a batch one shared (shifted) position and
    pass a scalar offset (faster on CUDA; see ``mlxcel.engine.kvcache``). The engine still
    checks that every rotary module is a pure rotation before it does.

    ``supports_batching``: False runs the family's models one request at a time, with no
    prompt cache.

    ``batch_cache``: a ``"module:attr"`` string naming ``batch_cache(rows) -> caches``,
    for a family whose models keep caches mlx-lm cannot batch. ``rows[r]`` is row ``r``'s
    per-layer caches (from the model's ``make_cache()``, or a prompt-cache entry); it
    returns one batch cache per layer holding every row, which must implement mlx-lm's
    batch-cache protocol (``prepare(lengths=, right_padding=)``, ``finalize()``,
    ``filter(indices)``, ``extend(other)``, ``extract(i)`` giving a row's cache back, and
    ``make_mask``/``update_and_fetch`` as its model calls them). Without it, a model whose
    every cache has mlx-lm's ``merge`` batches through it, a model on plain ``KVCache``
    only takes the engine's faster shared-position cache, and any other runs one slot.
    A family that names a factory always gets the mlx-lm protocol path, rows
    of a prefill group padded together.

    ``reasoning``: how its models mark reasoning (``ReasoningSpec``). None: the chat layer
    detects it from the vocabulary and the chat template (``chat.reasoning.detect``).
    """

    name: str
    model_types: tuple[str, ...]
    loader: str
    accepts: str | None = None
    capabilities: frozenset[str] = frozenset({"text"})
    supports_batching: bool = True
    default_tool_format: str | None = None
    reasoning: ReasoningSpec | None = None
    loop_detection: LoopPolicy | None = None
    relative_positions: bool = False
    batch_cache: str | None = None


class LoadOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What ``load(path, options)`` should honour.

    ``dtype``: ``auto`` = keep the checkpoint's dtype, or ``float32`` / ``float16`` /
    ``bfloat16`` = cast the floating-point parameters (quantized weights stay packed).
    The server resolves ``--dtype auto`` before calling: float32 on MLX's CPU device.

    ``lazy``: leave the parameters unevaluated (``--distributed``): the engine shards the
    model first, so each rank reads only its part of the weights. A loader that ignores it
    still works, at the cost of reading every weight on every rank.
    """

    dtype: str = "auto"
    trust_remote_code: bool = False
    lazy: bool = False


class LoadedModel(Protocol):
    """What the engine drives: an mlx-lm style model. ``model(inputs, cache)`` returns
    logits [B, T, V]; ``make_cache()`` gives one cache per layer."""

    def __call__(self, inputs: Any, cache: Any = None) -> Any: ...

    def make_cache(self) -> list[Any]: ...
