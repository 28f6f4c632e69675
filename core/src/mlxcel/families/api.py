"""Model family contract: which checkpoints a family owns, which tasks it serves, and how
it loads them (``mlxcel.families.tasks`` holds the side tasks' runner contracts)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from mlxcel.families.tasks import TASKS
from mlxcel.types.requests import LoopPolicy

__all__ = ["TASKS", "Family", "LoadOptions", "Loaded", "LoadedModel", "LoopPolicy",
           "ReasoningSpec"]


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
    """A model family plugin (contract v2: tasks, ``check``, ``load``).

    ``tasks``: task name (``mlxcel.families.tasks.TASKS``) -> ``"module:attr"`` that core
    calls for it. For ``generate`` the attr is ``decoder(loaded) -> LoadedModel``, the
    model the continuous batch drives; for a side task (``embed``, ``rerank``, ...) it is
    ``make(loaded, options: TaskOptions) -> runner`` (``mlxcel.families.tasks``).

    ``load``: a ``"module:attr"`` naming ``load(path, options: LoadOptions) -> Loaded``;
    imported only when a checkpoint of this family is loaded, on the engine thread.

    ``check``: a ``"module:attr"`` naming ``check(path, config) -> bool | str``: whether
    this family owns the checkpoint directory ``path`` (``config``: its ``config.json``),
    or a one-line reason it does not. It is cheap: no MLX import and no weight read, since
    it runs in the CLI before the server forks. It sees checkpoints with no
    ``tokenizer.json`` or chat template too (an embedder's, a speech model's).

    ``tasks_of``: for a family with several tasks, a ``"module:attr"`` naming
    ``tasks_of(path, config) -> tuple[str, ...]``: the tasks this checkpoint serves (an
    embedder's ``embed``, a cross-encoder's ``rerank``), as cheap as ``check``; ``-m``
    serves the first. None: every task of the family.

    Which family owns a checkpoint: among the families that serve the task asked for
    (``--embedding-model`` asks ``embed``; ``-m`` asks whichever task the checkpoint
    serves), one that lists its ``model_type`` in ``model_types`` and whose ``check`` (if
    any) passes; else the one catch-all (a family listing no types) whose ``check``
    passes. A listed type wins over a catch-all, so an installed family takes precedence
    for the types it names; two families taking one checkpoint are a startup error naming
    both. For ``-m`` a family that generates is asked first, so a chat checkpoint is
    served as one.

    The rest concern ``generate`` only:

    ``relative_positions``: the family's models read ``cache.offset`` only as the RoPE
    offset, so the engine may give every row of a batch one shared (shifted) position and
    pass a scalar offset (faster on CUDA; see ``mlxcel.engine.cache.kvcache``). The engine still
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
    of a prefill group padded together. ``extract(i)`` is also how the prompt cache
    copies a row's state out, at its end and at its checkpoints mid-prompt; the disk
    tier stores only mlx-lm's own cache classes (a family's own stay in memory).

    ``reasoning``: how its models mark reasoning (``ReasoningSpec``). None: the chat layer
    detects it from the vocabulary and the chat template (``mlxcel.model.reasoning``).
    ``loop_detection``: the tail n-gram loop policy its models need by default.
    """

    name: str
    tasks: dict[str, str]
    load: str
    model_types: tuple[str, ...] = ()
    check: str | None = None
    tasks_of: str | None = None
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

    ``task``: the task the server loads the checkpoint for (``--embedding-model`` loads
    for ``embed``); None for ``-m``, where the checkpoint's own task is served.

    ``lazy``: leave the parameters unevaluated (``--distributed``): the engine shards the
    model first, so each rank reads only its part of the weights. A loader that ignores it
    still works, at the cost of reading every weight on every rank.

    ``read_threads``: how many threads may read the weight files (1: the loader's own
    way). The server asks for more on CUDA, where MLX reads each tensor on the thread that
    evaluates it, into pageable memory, one after another. A loader that ignores it still
    works, at that one thread's speed.
    """

    dtype: str = "auto"
    trust_remote_code: bool = False
    lazy: bool = False
    task: str | None = None
    read_threads: int = 1


class Loaded(msgspec.Struct, kw_only=True):
    """What ``load`` returns: the model and what the family brings with it.

    ``tasks``: the tasks this checkpoint serves (of the family's). ``tokenizer`` /
    ``template`` / ``processor``: the family's own, or None for core's text default
    (``tokenizer.json`` and the checkpoint's chat template, loaded by core for
    ``generate``). ``config``: the checkpoint's ``config.json``.
    """

    model: Any
    tasks: tuple[str, ...]
    config: dict[str, Any] = {}
    tokenizer: Any = None
    template: Any = None
    processor: Any = None


class LoadedModel(Protocol):
    """What the engine drives: an mlx-lm style model. ``model(inputs, cache)`` returns
    logits [B, T, V]; ``make_cache()`` gives one cache per layer.

    Optional: ``lean_decoder() -> forward | None``, a decode step's forward on [B, D]
    activations, ``forward(tokens [B], caches, shift=None) -> logits [B, V]`` (``shift``:
    each row's position shift, ``mlxcel.families.media``), for a model whose layers core's
    mirrors do not recognise; ``mlxcel.engine.accel.lean_decode.mirrored`` builds one from
    Llama-shaped layers. The engine takes it where its policy asks for a lean decode and
    one decode step of it agrees with the model's own forward; None: the model's own."""

    def __call__(self, inputs: Any, cache: Any = None) -> Any: ...

    def make_cache(self) -> list[Any]: ...
