"""Load a vision-language checkpoint with mlx-vlm's loader: its model (vision tower,
projector and language model) and its processor (image processor, tokenizer and chat
template, as ``mlx_vlm.utils.load`` assembles them).

The ``generate`` task's decoder drives the language model for text rows, as the engine
drives an mlx-lm model: ``model(inputs, cache)`` gives logits and ``make_cache()`` the
language model's own caches; image rows go through the media contract
(``mlxcel.families.media``): the processor expands the prompt, the vision tower runs once
per image, and the row prefills its input embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlxcel.families.api import Loaded, LoadOptions
from mlxcel.types.media import MediaPrompt

from mlxcel_family_vlm import lean, media, towers
from mlxcel_family_vlm.features import encoded, encoded_together
from mlxcel_family_vlm.positions import HOST_RULE, mrope_positions
from mlxcel_family_vlm.processed import ProcessedImages

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def load(path: Path, options: LoadOptions) -> Loaded:
    """mlx-vlm's model and processor for the checkpoint. The tokenizer and chat template
    stay core's text default (``tokenizer.json`` and the checkpoint's template), which
    the processor's are built from too."""
    from mlx_vlm.utils import load as vlm_load

    extra = {"trust_remote_code": True} if options.trust_remote_code else {}
    model, processor = vlm_load(str(path), lazy=options.lazy, **extra)
    dtype = _DTYPES.get(options.dtype)  # "auto": keep the checkpoint's dtype
    if dtype is not None:
        model.set_dtype(dtype)  # floating parameters only: packed weights stay as they are
    model.eval()
    towers.repair(model)
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else {}
    return Loaded(model=model, tasks=("generate",), config=_checkpoint_config(path, config),
                  processor=processor)


def _checkpoint_config(path: Path, fallback: dict) -> dict:
    import json

    try:
        return json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return fallback


def decoder(loaded: Loaded) -> VisionLanguageModel:
    """The ``generate`` task: the model the continuous batch drives."""
    return VisionLanguageModel(loaded.model, loaded.processor, loaded.config)


class VisionLanguageModel:
    """An mlx-vlm model as the engine drives it. ``model``: mlx-vlm's module (vision
    tower and language model); ``processor``: its processor; ``config``: config.json.

    Text rows run the language model alone. Where its rotary positions are M-RoPE's
    (Qwen-VL: three position rows, for time, height and width), a text token's three
    positions are equal, its index in the row plus the row's shift (0 for a text row; an
    image row's rope delta), so they are given explicitly from each row's cache offset:
    mlx-vlm's own fallback keeps the last prompt's rope deltas on the module, which rows
    of a batch must not share. Image rows take the media contract
    (``mlxcel.families.media``), implemented in ``mlxcel_family_vlm.media``.
    """

    media_kinds = ("image",)
    media_batch = True  # image rows prefill together, padded (mlxcel.families.media)

    def __init__(self, model: Any, processor: Any, config: dict) -> None:
        self.model = model
        self.processor = processor
        self.config = config
        text = config.get("text_config") or {}
        scaling = config.get("rope_scaling") or text.get("rope_scaling") or {}
        self.mrope = isinstance(scaling, dict) and "mrope_section" in scaling
        self.processed = ProcessedImages()  # the processor's arrays of recent images

    @property
    def language_model(self) -> Any:
        return self.model.language_model

    def lean_decoder(self) -> Any | None:
        """The decode step on [B, D] activations for an M-RoPE language model whose layout
        ``mlxcel_family_vlm.lean`` mirrors (``mlxcel.families.api.LoadedModel``), else
        None: text rows and image rows alike, each row's shift added to its offset."""
        return lean.lean_decoder(self.language_model) if self.mrope else None

    def make_cache(self) -> list[Any]:
        language = self.language_model
        if hasattr(language, "make_cache"):
            return language.make_cache()
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(language)

    # -- the media contract --------------------------------------------------------------
    def media_placeholder(self, kind: str) -> str:
        return media.placeholder(self.processor)

    def expand_media(self, token_ids: list[int], items: list[Any],
                     options: dict[str, Any]) -> MediaPrompt:
        return media.expand(self.processor, token_ids, [item.image for item in items],
                            tuple(item.digest for item in items), self.processed)

    def media_positions(self, prompt: MediaPrompt) -> tuple[mx.array | None, int]:
        grid = (prompt.inputs or {}).get("image_grid_thw")
        if not self.mrope or grid is None:
            return None, 0
        rule = self._host_rule()
        if rule is not None:  # on the host: no device reads while steps are in flight
            out, delta = mrope_positions(prompt.token_ids, np.asarray(grid), *rule)
            return mx.array(out)[:, None, :], delta
        ids = mx.array(prompt.token_ids, dtype=mx.int32)[None]
        positions, delta = self.language_model.get_rope_index(ids, mx.array(grid))
        return positions, int(mx.array(delta).reshape(-1)[0].item())

    def text_embeddings(self, ids: mx.array) -> mx.array:
        return self.model.get_input_embeddings(ids).inputs_embeds

    def media_features(self, prompts: list[MediaPrompt], held: Any) -> dict[bytes, Any]:
        return encoded_together(self.model, prompts, held)

    def media_embeddings(self, prompt: MediaPrompt, features: Any) -> mx.array:
        inputs = dict(prompt.inputs or {})
        inputs.pop("rule", None)
        arrays = {k: mx.array(v) for k, v in inputs.items()}
        pixels = arrays.pop("pixel_values")
        cached = encoded(self.model, prompt, pixels, arrays, features)
        if cached is not None:
            arrays["cached_image_features"] = cached
        ids = mx.array(prompt.token_ids, dtype=mx.int32)[None]
        # every token is real (some models build their masks from it); attention stays
        # the language model's own causal one
        return self.model.get_input_embeddings(ids, pixels, mask=mx.ones(ids.shape),
                                               **arrays).inputs_embeds

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, *,
                 embeds: mx.array | None = None, positions: mx.array | None = None,
                 shift: mx.array | None = None) -> mx.array:
        kwargs = self.embeds_kwargs(inputs, embeds) if embeds is not None else {}
        if positions is not None:
            kwargs["position_ids"] = positions
        elif self.mrope:
            kwargs["position_ids"] = self._positions(inputs, cache, shift)
        out = self.language_model(inputs, cache=cache, **kwargs)
        return getattr(out, "logits", out)

    def _host_rule(self) -> tuple[int, int, int] | None:
        """(merge, image token, vision start) where ``positions.mrope_positions`` mirrors
        the language model's ``get_rope_index`` (``positions.HOST_RULE``), else None."""
        config = getattr(self.language_model, "config", None)
        if self.config.get("model_type") not in HOST_RULE or config is None:
            return None
        try:
            return (int(config.vision_config.spatial_merge_size), int(config.image_token_id),
                    int(config.vision_start_token_id))
        except (AttributeError, TypeError):
            return None

    def embeds_kwargs(self, inputs: mx.array, embeds: mx.array) -> dict[str, Any]:
        """What the language model takes for a prefill chunk of input embeddings (a family
        adds what its model needs beside them, from the chunk's ids ``inputs``)."""
        return {"inputs_embeds": embeds}

    @staticmethod
    def _positions(inputs: mx.array, cache: list[Any] | None,
                   shift: mx.array | None = None) -> mx.array:
        """[3, B, T] positions: each row's cache offset (a scalar, or one per row in a
        batch cache) plus the token's index in this chunk, plus the row's shift."""
        batch, length = inputs.shape
        offset = getattr(cache[0], "offset", 0) if cache else 0
        steps = mx.arange(length)[None, :]
        if isinstance(offset, mx.array) and offset.ndim > 0:
            rows = offset.reshape(-1, 1) + steps
        else:
            rows = mx.broadcast_to(steps + int(offset), (batch, length))
        if shift is not None:
            rows = rows + shift.reshape(-1, 1)
        return mx.broadcast_to(rows[None], (3, batch, length))
