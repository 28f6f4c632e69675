"""Gemma 4's image input: mlx-vlm's model and processor behind the media contract
(``mlxcel.families.media``), on ``mlxcel_family_vlm``'s generic decoder.

What Gemma 4 does unlike the generic rules (``mlxcel_family_vlm.media.rule`` reads its
processor as ``sequence``, Gemma 3's rule, which is wrong for it):

- **Expansion.** The chat template prints ``<|image|>`` per image; the processor sizes
  each image on its own (aspect ratio kept, at most ``max_soft_tokens`` soft tokens after
  pooling) and the placeholder becomes ``<|image>``, that many ``<|image|>``, ``<image|>``.
  Images of several sizes give pixel arrays of several shapes, so they are kept one array
  per image.
- **Budget.** ``max_soft_tokens`` (the request's ``options``) is the processor's budget;
  Gemma 4 is trained on ``SUPPORTED`` budgets, so another value is a 400, save the
  checkpoint's own default. Under a budget other than the default an image has other
  features and other tokens, so its digest in the prompt (``MediaPrompt.digests``) is the
  blob's combined with the budget: the vision-feature cache and the prompt cache's block
  hashes both key on it, and the same picture under two budgets shares neither features
  nor KV. Under the default budget the digest is the blob's own.
- **Features.** ``encode_image`` (vision tower and projector) encodes one image alone, so
  every image goes through the engine's feature cache by its digest.
- **Per-layer inputs.** Gemma 4's small models add a per-layer embedding of each token;
  mlx-vlm's ``get_input_embeddings`` takes it from the ids with image, audio and video
  tokens set to 0, so an image row's chunks compute theirs so too.
- **Vision attention.** Where the text config asks for it
  (``use_bidirectional_attention: "vision"``), image tokens attend to their whole image:
  a chunk passes its image tokens as ``mm_token_type_ids``, and mlx-vlm's language model
  lays the overlay on a chunk's square mask, as mlx-vlm's own generate loop does (a chunk
  after cached tokens stays causal there too).
- **Caches.** mlx-lm's ``KVCache`` and ``RotatingKVCache``, as mlx-lm's own Gemma 4 text
  model makes them, in place of mlx-vlm's look-alikes: the engine batches, extracts and
  stores mlx-lm's classes (``mlxcel.engine.cache.kinds``), so text and image rows batch
  and share the prompt cache as text-only Gemma 4 does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import numpy as np
from mlxcel.errors import InvalidRequest
from mlxcel.types.media import MediaPrompt
from mlxcel_family_vlm.load import VisionLanguageModel
from mlxcel_family_vlm.media import placeholders_at, splice

SUPPORTED = (70, 140, 280, 560, 1120)  # Gemma 4's soft-token budgets (its processor's)


def keyed(digest: bytes, budget: int, default: int) -> bytes:
    """An image's digest under ``budget``: the blob's own under the default budget."""
    if budget == default:
        return digest
    return hashlib.sha256(digest + b"max_soft_tokens=%d" % budget).digest()


class Gemma4Vision(VisionLanguageModel):
    """A Gemma 4 checkpoint with a vision tower, as the engine drives it (the module
    docstring says what it adds to the generic decoder)."""

    def __init__(self, model: Any, processor: Any, config: dict) -> None:
        super().__init__(model, processor, config)
        cfg = model.config
        self.image_id = int(cfg.image_token_id)
        self.boi_id, self.eoi_id = int(cfg.boi_token_id), int(cfg.eoi_token_id)
        self.media_ids = [t for t in (cfg.image_token_id, cfg.audio_token_id,
                                      getattr(cfg, "video_token_id", None)) if t is not None]
        text = cfg.text_config
        self.per_layer = bool(getattr(text, "hidden_size_per_layer_input", 0))
        self.bidirectional = getattr(text, "use_bidirectional_attention", None) == "vision"
        self.default_budget = int(processor.image_processor.max_soft_tokens)

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        text = self.model.config.text_config
        own = self.language_model.model.first_kv_shared_layer_idx
        return [KVCache() if kind == "full_attention"
                else RotatingKVCache(max_size=text.sliding_window, keep=0)
                for kind in text.layer_types[:own]]

    # -- the media contract --------------------------------------------------------------
    def media_placeholder(self, kind: str) -> str:
        return str(self.processor.image_token)

    def budget(self, options: dict[str, Any]) -> int:
        """The request's ``max_soft_tokens``, else the processor's; a 400 for a budget
        Gemma 4 does not take."""
        value = options.get("max_soft_tokens")
        if value is None:
            return self.default_budget
        if value not in SUPPORTED and value != self.default_budget:
            allowed = ", ".join(str(v) for v in sorted({*SUPPORTED, self.default_budget}))
            raise InvalidRequest(f"max_soft_tokens {value} is not one of Gemma 4's image "
                                 f"token budgets ({allowed})", param="max_soft_tokens")
        return int(value)

    def expand_media(self, token_ids: list[int], items: list[Any],
                     options: dict[str, Any]) -> MediaPrompt:
        budget = self.budget(options)
        data, counts = self.processor.image_processor([item.image for item in items],
                                                      max_soft_tokens=budget)
        pixels = tuple(np.asarray(p) for p in data["pixel_values"])
        at = placeholders_at(token_ids, self.image_id, len(items))
        runs = [[self.boi_id] + [self.image_id] * int(n) + [self.eoi_id] for n in counts]
        inner = [(1, int(n)) for n in counts]
        digests = tuple(keyed(item.digest, budget, self.default_budget) for item in items)
        return splice(token_ids, at, runs, inner, digests, {"pixel_values": pixels})

    def media_embeddings(self, prompt: MediaPrompt, features: Any) -> mx.array:
        pixels = [mx.array(p)[None] for p in prompt.inputs["pixel_values"]]
        parts = [features.get(digest, lambda p=p: self.model.encode_image(p))
                 for digest, p in zip(prompt.digests, pixels, strict=True)]
        ids = mx.array(prompt.token_ids, dtype=mx.int32)[None]
        return self.model.get_input_embeddings(
            ids, pixel_values=pixels,
            cached_image_features=mx.concatenate(parts, axis=1)).inputs_embeds

    def embeds_kwargs(self, inputs: mx.array, embeds: mx.array) -> dict[str, Any]:
        """Gemma 4's per-layer inputs from the chunk's ids with media tokens zeroed, and
        where its text config asks for it, the image tokens' type for their attention."""
        kwargs: dict[str, Any] = {"inputs_embeds": embeds}
        media = mx.zeros(inputs.shape, dtype=mx.bool_)
        for token in self.media_ids:
            media = media | (inputs == token)
        if self.per_layer:
            text_ids = mx.where(media, mx.zeros_like(inputs), inputs)
            kwargs["per_layer_inputs"] = self.language_model.model.get_per_layer_inputs(text_ids)
        if self.bidirectional:
            kwargs["mm_token_type_ids"] = (inputs == self.image_id).astype(mx.int32)
        return kwargs
