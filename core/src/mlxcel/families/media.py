"""What a ``generate`` family's decoder adds to take media in prompts (contract v2).

Core fetches every media part (``mlxcel.media.fetch``) and decodes it into an item
(``mlxcel.media.api``); the chat template prints a placeholder for each (an HF template
reads an image part as ``{"type": "image"}``); the decoder does the rest, which only it
knows, through these members. A decoder without them takes text only, and a request with
a media part gets 501 before anything is fetched.

``media_kinds``: the kinds of item it takes (``("image",)``).

``media_placeholder(kind) -> str``: the text a raw prompt (llama-server's ``/completion``
multimodal form, whose ``<__media__>`` markers core replaces with it) puts where an item
goes: what the chat template prints for an image part.

``expand_media(token_ids, items, options) -> MediaPrompt``: the tokenized prompt, whose
placeholders (one per item, in order) it replaces with each item's own tokens, sized
as the model's processor sizes the item; ``inputs`` carries the processor's outputs
(NumPy arrays). ``options``: the request's media knobs (``max_soft_tokens``), unknown
keys ignored. It runs on the HTTP side, in a worker thread, so it must not touch MLX
arrays; a placeholder count that is not the item count is ``InvalidRequest``. An item
its processor cannot take (Qwen-VL's refuses an image whose sides differ by more than
200 times) is ``MediaRefused(index, reason)``, or any ``ValueError`` where the decoder
cannot tell which item it was: core answers 400 naming the part, never 500.

On the engine thread:

``media_positions(prompt) -> (positions, shift)``: the rotary positions of the whole
prompt where the model's are not the token index (Qwen-VL's M-RoPE: ``[3, 1, T]``), else
None; and ``shift``, what every generated token's position adds to its index (M-RoPE's
rope delta; 0 otherwise). Cheap: no vision tower.

``media_embeddings(prompt, features) -> mx.array``: the prompt's input embeddings
``[1, T, D]``, each item's features in its span. ``features`` is core's vision-feature
cache (``mlxcel.engine.media_rows.FeatureCache``): ``features.get(digest, compute)``
returns an item's features, calling ``compute()`` only for an item it does not hold, so
the vision tower runs once per image while it stays cached (``--vision-cache-size``).

``__call__(inputs, cache, *, embeds=None, positions=None, shift=None)``: the usual
forward, plus a prefill chunk's rows of ``embeds`` and ``positions`` (sliced to the
chunk) in place of the tokens' own, and in a decode step ``shift`` ``[B]``, each row's
shift (0 for a text row).

Optional: ``media_features(prompts, held) -> dict[bytes, features]``: the features of the
items of the prompts of one prefill group (one row's several images, or several rows')
that ``held(digest)`` says the feature cache lacks, encoded in as few vision-tower calls
as the model allows, by digest; ``media_embeddings`` then gets each of them from ``features`` instead of
encoding it alone. Return ``{}`` where items can only be encoded one by one.

Optional: ``text_embeddings(ids) -> mx.array``: ``[B, T, D]``, the embeddings of token ids
``[B, T]``, as ``media_embeddings`` gives them at text positions. A row of a group whose
uncached part holds no item (its items lie in its cached prefix) takes these in a chunk
where another row's items need embeddings, instead of its whole prompt's.

Optional: ``media_batch = True`` says that image rows may prefill together: a chunk's
``inputs``, ``embeds`` ``[B, T, D]`` and ``positions`` then hold several rows, each
padded to the group's width (on the left or on the right, as the batch caches pad), a
padded column carrying token 0 and zero embeddings and positions, which the caches'
masks keep from every real token. Without it each image row prefills alone: a decoder
whose forward builds its own masks from the chunk (bidirectional attention over an
image's tokens) must not set it unless padding leaves them right. A prefill chunk that holds no item's tokens comes with
``positions`` and without ``embeds``: the embeddings of its text tokens must be what
``media_embeddings`` gives there, so that a cache hit past the items skips building them.
"""

from __future__ import annotations

from typing import Any


class MediaRefused(ValueError):
    """``expand_media``'s refusal of one item: ``index`` in ``items``, and ``reason``,
    the processor's own words (they name sizes, never the request's bytes)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


MEMBERS = ("media_kinds", "media_placeholder", "expand_media", "media_positions",
           "media_embeddings")


def media_kinds(model: Any) -> tuple[str, ...]:
    """The media kinds ``model`` (a loaded decoder) takes: none unless it has every member
    of the contract."""
    if not all(hasattr(model, name) for name in MEMBERS):
        return ()
    return tuple(getattr(model, "media_kinds", ()) or ())
