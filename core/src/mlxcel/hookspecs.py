"""The mlxcel plugin API: every hook a plugin can implement.

A plugin is a module (or object) named by an entry point in group ``mlxcel``. It implements
any of the hooks below with ``@hookimpl``. Hooks *register*; they never run on the token
path. Register heavy code as ``"module:attr"`` strings so importing the plugin stays cheap.

Example (``pyproject.toml``)::

    [project.entry-points.mlxcel]
    family-gemma4 = "mlxcel_family_gemma4.plugin"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from mlxcel.dialects.registry import DialectRegistry
    from mlxcel.drafters.registry import DrafterRegistry
    from mlxcel.families.registry import FamilyRegistry
    from mlxcel.media.registry import MediaDecoderRegistry
    from mlxcel.toolcalls.registry import ToolFormatRegistry

PROJECT = "mlxcel"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def mlxcel_register_families(registry: FamilyRegistry) -> None:
    """Register model families: ``registry.add(Family(...))``.

    A ``Family`` (``mlxcel.families.api``) declares its **tasks** (``generate``, ``embed``,
    ``rerank``, later ``transcribe``, ``speak``, ``generate_image``, ``realtime``), each a
    ``"module:attr"`` core calls: for ``generate`` the model the continuous batch drives,
    for a side task a runner factory (``mlxcel.families.tasks``: ``Embedder``,
    ``Reranker``), whose jobs run on the engine's job lane. ``check(path, config)`` decides
    cheaply (no MLX, no weights) whether it owns a checkpoint, ``tasks_of`` which tasks a
    checkpoint serves, and ``load(path, LoadOptions) -> Loaded`` returns the model with
    what it brings (tokenizer, template, processor; None takes core's text default).
    ``LoadOptions.lazy`` (``--distributed``) asks for the parameters unevaluated, so the
    engine can shard the model before its weights are read. A generating family may give
    its models' defaults: a tool format, a ``ReasoningSpec`` (how answers mark reasoning:
    ``<think>`` blocks, a labelled channel, harmony messages; without one the chat layer
    detects it from the template), a loop policy and a batch cache. A ``generate`` model
    that takes images implements the media contract (``mlxcel.families.media``: expand
    the prompt's placeholders, positions, input embeddings). What a family must pass:
    ``mlxcel.testing.conformance.check_family`` (``generate``), ``check_media_model``
    (the media contract), ``check_embedder`` and ``check_reranker`` (the side tasks'
    runners).
    """


@hookspec
def mlxcel_register_tool_formats(registry: ToolFormatRegistry) -> None:
    """Register tool-call wire formats: ``registry.add(ToolFormat(...))``.

    A ``ToolFormat`` (``mlxcel.toolcalls.api``, whose module docstring is contract v1)
    names its parser as ``"module:attr"`` of ``new_parser(tools) -> ToolCallParser``: fed
    the answer text with special tokens' text kept and the token ids behind it, it
    returns typed events (``mlxcel.types.toolcalls``) that are the same however the text
    is cut, and ``finish()`` gives the authoritative calls of the whole answer.
    ``detect(template)`` and ``specificity`` choose the format of a chat template: the
    most specific match wins, a tie is a startup error. ``grammar`` optionally names
    ``grammar(tools, choice) -> Constraint | None``, the output constraint of a forced
    ``tool_choice``: a ``WrappedJsonConstraint`` (JSON in fixed markup) or a
    ``RegexConstraint`` (a syntax of its own), whose ``markers`` are written as the
    tokenizer's added tokens where it has them, and whose every match the parser reads
    as calls of ``tools``. ``mlxcel.testing.conformance.check_tool_format`` is what a
    format must pass.
    """


@hookspec
def mlxcel_register_media_decoders(registry: MediaDecoderRegistry) -> None:
    """Register media decoders: ``registry.add(MediaDecoder(...))``.

    Core fetches a content part (data URI, URL, local file) into a ``MediaBlob``
    (``mlxcel.types.media``: the bytes, the declared MIME type, their sha256 digest); a
    ``MediaDecoder`` (``mlxcel.media.api``, contract v2) turns it into an ``ImageItem``
    (an RGB ``PIL.Image``), a ``VideoItem`` (RGB frames and their fps) or an
    ``AudioItem`` (mono float32 PCM and its rate), each carrying the blob's digest, which
    the vision cache and the prompt cache key on. ``mimes`` maps each MIME type it takes
    to the bytes regex that identifies the format at the blob's start: core picks the
    decoder from the bytes, the highest ``priority`` among those that match (core's own
    Pillow decoder, ``pillow``, takes PNG, JPEG, GIF, WebP and BMP at 0), and refuses a
    declared type that names another format. ``decode`` is the ``"module:attr"`` of
    ``decode(blob, limits: MediaLimits) -> item``, imported on the first blob it takes;
    it checks the size the header declares with ``mlxcel.media.api.check_image_size``
    before decoding a pixel, and raises ``MediaRefused`` (or anything, for bytes it
    cannot read): core answers 400 naming the content part. What a decoder must pass:
    ``mlxcel.testing.conformance.check_media_decoder``.
    """


@hookspec
def mlxcel_register_drafters(registry: DrafterRegistry) -> None:
    """Register drafters for speculative decoding: ``registry.add(Drafter(...))``.

    A ``Drafter`` (``mlxcel.drafters.api``) has a ``kind`` (``prompt-lookup``, ``draft``,
    ``mtp`` or ``dflash``: what a response's ``timings.draft_kind`` says) and ``session``,
    the ``"module:attr"`` of ``new_session(target: DraftTarget, options: DraftOptions) ->
    DraftSession``, imported when the engine starts with it. On the engine thread, between
    decode steps, ``session.propose(rows, limits)`` returns up to ``limits[i]`` guessed
    next tokens for each ``DraftRow`` (its ``key`` and its context ``tokens``, read only);
    the engine verifies every drafting row of the batch in one forward and keeps each
    row's longest prefix that the target itself produces (its argmax, or its own draw at
    each position), so the output is the target's, exactly. ``commit(rows, accepted)``
    tells how many of each row's tokens were kept; ``release(keys)`` that rows left. A
    session whose class sets ``needs_hidden = True`` (MTP heads, assistants, DFlash) also
    gets, per row, the target's last hidden state (``DraftRow.hidden``, the final norm's
    output at the row's last kept position(s), or with ``hidden_layers`` those decoder
    layers' outputs joined) and its layer caches (``DraftRow.cache``); others pay
    nothing for it. Core registers ``prompt-lookup`` (``mlxcel.drafters.lookup``). What a
    drafter must pass: ``mlxcel.testing.conformance.check_drafter``.
    """


@hookspec
def mlxcel_register_dialects(registry: DialectRegistry) -> None:
    """Register API dialects: ``registry.add(Dialect(...))``."""


# the registries of ``Plugins``, in the order they fill: each has the hook
# ``mlxcel_register_<attribute>`` and shows in `mlxcel-server plugins` as its attribute
# with spaces (hook name -> (attribute, label))
REGISTRY_HOOKS = {f"mlxcel_register_{attr}": (attr, attr.replace("_", " "))
                  for attr in ("families", "tool_formats", "media_decoders", "drafters",
                               "dialects")}
