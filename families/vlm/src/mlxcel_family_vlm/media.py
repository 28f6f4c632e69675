"""Images into an mlx-vlm model's prompt: the placeholders the chat template printed
become each image's tokens, sized as the model's processor sizes the image, and the
prompt's input embeddings carry each image's features (``mlxcel.families.media``).

Expansion, by what the processor says of itself:

- ``grid``: the processor sizes images on a patch grid (``image_processor.merge_size``,
  Qwen2/2.5/3-VL): the template's ``image_token`` becomes ``t*h*w / merge_size**2`` of it;
- ``sequence``: the processor replaces a begin-of-image token with a whole sequence
  (``full_image_sequence``, Gemma 3): the template's ``boi_token`` becomes that sequence;
- ``text``: any other processor expands the decoded prompt text itself (``processor(text=,
  images=)``), and each image's growth is read from the result.

Features: a model whose vision tower can encode one image alone (Qwen-VL's tower over its
grid, Gemma 3's tower and projector, a model's ``encode_image``) gets each image's from
the engine's feature cache, keyed by the image's digest; the others encode every image of
the prompt together in ``get_input_embeddings``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlxcel.errors import InvalidRequest
from mlxcel.types.media import MediaPrompt


def rule(processor: Any) -> str:
    """How ``processor`` expands an image placeholder (the module docstring)."""
    images = getattr(processor, "image_processor", None)
    if getattr(images, "merge_size", None) and getattr(processor, "image_token_id", None) \
            is not None:
        return "grid"
    if getattr(processor, "full_image_sequence", None) and getattr(processor, "boi_token",
                                                                   None):
        return "sequence"
    return "text"


def placeholder(processor: Any) -> str:
    """The text a raw prompt puts where an image goes: the chat template's image text."""
    if rule(processor) == "sequence":
        return processor.boi_token
    return str(getattr(processor, "image_token", "<image>"))


def _arrays(out: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in dict(out).items() if v is not None}


def _tokenizer(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def _token_id(processor: Any, text: str) -> int:
    tok = _tokenizer(processor)
    found = tok.convert_tokens_to_ids(text)
    if found is None or found == getattr(tok, "unk_token_id", None):
        raise InvalidRequest(f"the model's vocabulary has no '{text}' token for images")
    return int(found)


def _positions_of(ids: list[int], token: int, count: int) -> list[int]:
    at = [i for i, t in enumerate(ids) if t == token]
    if len(at) != count:
        raise InvalidRequest(f"the chat template printed {len(at)} image placeholder(s) "
                             f"for {count} image(s)", param="messages")
    return at


def expand(processor: Any, ids: list[int], images: list[Any], digests: tuple[bytes, ...]
           ) -> MediaPrompt:
    """``ids`` with each image placeholder replaced by the image's tokens (the rules)."""
    how = rule(processor)
    if how == "text":
        return _expand_text(processor, ids, images, digests)
    pixels = _arrays(processor.image_processor(images=images, return_tensors="np"))
    if how == "grid":
        token = int(processor.image_token_id)
        merge = int(processor.image_processor.merge_size)
        grids = pixels["image_grid_thw"].reshape(-1, 3)
        runs = [[token] * int(np.prod(g) // merge ** 2) for g in grids]
        inner = [(0, len(r)) for r in runs]
    else:
        token = _token_id(processor, processor.boi_token)
        run = list(_tokenizer(processor).encode(processor.full_image_sequence,
                                                add_special_tokens=False))
        image_id = _token_id(processor, processor.image_token)
        first = run.index(image_id)
        inner_span = (first, run.count(image_id))
        runs, inner = [run] * len(images), [inner_span] * len(images)
    at = _positions_of(ids, token, len(images))
    return _splice(ids, at, runs, inner, digests, {**pixels, "rule": how})


def _splice(ids: list[int], at: list[int], runs: list[list[int]],
            inner: list[tuple[int, int]], digests: tuple[bytes, ...],
            inputs: dict[str, Any]) -> MediaPrompt:
    out: list[int] = []
    spans, grown, last = [], [], 0
    for position, run, (offset, length) in zip(at, runs, inner, strict=True):
        out.extend(ids[last:position])
        spans.append((len(out) + offset, length))
        grown.append((position, len(run) - 1))
        out.extend(run)
        last = position + 1
    out.extend(ids[last:])
    return MediaPrompt(token_ids=tuple(out), spans=tuple(spans), digests=digests,
                       grown=tuple(grown), inputs=inputs)


def _expand_text(processor: Any, ids: list[int], images: list[Any],
                 digests: tuple[bytes, ...]) -> MediaPrompt:
    """The processor's own expansion of the decoded prompt; each image's span is its run
    of image tokens, and the growth before every later position is read by walking both
    id lists (text between images is unchanged)."""
    tok = _tokenizer(processor)
    text = tok.decode(ids, skip_special_tokens=False)
    out = processor(text=[text], images=images, return_tensors="np")
    arrays = _arrays(out)
    new = [int(t) for t in arrays.pop("input_ids").reshape(-1)]
    arrays.pop("attention_mask", None)
    image_id = int(getattr(processor, "image_token_id", None)
                   or _token_id(processor, placeholder(processor)))
    runs = _runs(new, image_id)
    if len(runs) < len(images):
        raise InvalidRequest(f"the chat template printed {len(runs)} image placeholder(s) "
                             f"for {len(images)} image(s)", param="messages")
    per = len(runs) // len(images)  # a tiled image (Idefics, Pixtral rows) has several
    spans = [(runs[i * per][0], runs[i * per + per - 1][0] + runs[i * per + per - 1][1]
              - runs[i * per][0]) for i in range(len(images))]
    growth = (len(new) - len(ids)) // max(1, len(images))
    at = [i for i, t in enumerate(ids) if t == image_id][:len(images)]
    at = at if len(at) == len(images) else [s - i * growth for i, (s, _) in enumerate(spans)]
    return MediaPrompt(token_ids=tuple(new), spans=tuple(spans), digests=digests,
                       grown=tuple((p, growth) for p in at), inputs={**arrays, "rule": "text"})


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
