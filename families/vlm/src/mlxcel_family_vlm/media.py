"""Images into an mlx-vlm model's prompt: the placeholders the chat template printed
become each image's tokens, sized as the model's processor sizes the image, and the
prompt's input embeddings carry each image's features (``mlxcel.families.media``).

Expansion, by what the processor says of itself:

- ``grid``: the processor sizes images on a patch grid (``image_processor.merge_size``,
  Qwen2/2.5/3-VL): the template's ``image_token`` becomes ``t*h*w / merge_size**2`` of it;
- ``sequence``: the processor replaces a begin-of-image token with a whole sequence
  (``full_image_sequence``, Gemma 3): the template's ``boi_token`` becomes that sequence;
- ``text``: any other processor expands the placeholder in text itself (``processor(text=,
  images=)``: LLaVA's fixed run, SmolVLM's tiles, Pixtral's patch rows); each image's
  run is the processor's own expansion of one placeholder with that image, spliced where
  the placeholder was (``_expand_text``).

Features: a model whose vision tower can encode one image alone (Qwen-VL's tower over its
grid, Gemma 3's tower and projector, a model's ``encode_image``) gets each image's from
the engine's feature cache, keyed by the image's digest; the others (the ``text`` rule's)
encode every image of the prompt together in ``get_input_embeddings``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlxcel.errors import InvalidRequest
from mlxcel.families.media import MediaRefused
from mlxcel.types.media import MediaPrompt

from mlxcel_family_vlm.processed import ProcessedImages


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
    """The text a raw prompt puts where an image goes: what the chat template prints for
    an image part (Qwen-VL's image token inside its vision start and end tokens)."""
    if rule(processor) == "sequence":
        return processor.boi_token
    token = str(getattr(processor, "image_token", "<image>"))
    vocab = _tokenizer(processor).get_vocab() if hasattr(_tokenizer(processor),
                                                         "get_vocab") else {}
    if rule(processor) == "grid" and "<|vision_start|>" in vocab and "<|vision_end|>" in vocab:
        return f"<|vision_start|>{token}<|vision_end|>"
    return token


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


def placeholders_at(ids: list[int], token: int, count: int) -> list[int]:
    """The positions of ``token`` in ``ids``, which must be ``count`` (one per item): a
    family kit, as ``splice`` is."""
    at = [i for i, t in enumerate(ids) if t == token]
    if len(at) != count:
        raise InvalidRequest(f"the chat template printed {len(at)} image placeholder(s) "
                             f"for {count} image(s)", param="messages")
    return at


def expand(processor: Any, ids: list[int], images: list[Any], digests: tuple[bytes, ...],
           processed: ProcessedImages | None = None) -> MediaPrompt:
    """``ids`` with each image placeholder replaced by the image's tokens (the rules);
    ``processed``: the arrays of images seen lately, by digest (``grid`` and ``sequence``
    rules; ``mlxcel_family_vlm.processed``)."""
    how = rule(processor)
    if how == "text":
        return _expand_text(processor, ids, images, digests)
    pixels = (processed.arrays(processor, images, digests) if processed is not None
              else _arrays(processor.image_processor(images=images, return_tensors="np")))
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
    at = placeholders_at(ids, token, len(images))
    return splice(ids, at, runs, inner, digests, {**pixels, "rule": how})


def splice(ids: list[int], at: list[int], runs: list[list[int]],
           inner: list[tuple[int, int]], digests: tuple[bytes, ...],
           inputs: dict[str, Any]) -> MediaPrompt:
    """``ids`` with the token at each of ``at`` replaced by its ``runs`` entry; ``inner``:
    where in its run each item's own tokens are (offset, length)."""
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
    """The processor's own expansion of each placeholder, spliced into ``ids``.

    The processor expands the placeholders of a text, never of ids, and what one image
    becomes depends on that image (SmolVLM's tile rows and columns, Pixtral's patch rows),
    so each image's run is the processor's expansion of one placeholder with that image
    alone, less the tokens its tokenizer adds to any text (a BOS). The pixel inputs come
    from one call with every image, as the model takes them. The text around the
    placeholders keeps the ids it came with: a run starts and ends with special tokens,
    which the tokenizer never merges with their neighbours, so the result is the ids the
    processor gives for the whole decoded prompt, without decoding it and tokenizing it
    again. Each image's growth is its own run's, at its own placeholder; its span, from
    its first image token to its last (the row or tile markers between them included)."""
    image_id = _image_token_id(processor)
    at = placeholders_at(ids, image_id, len(images))
    mark = placeholder(processor)
    runs = []
    for index, image in enumerate(images if len(images) > 1 else ()):
        try:
            runs.append(_bare(processor, processor(text=[mark], images=[image],
                                                   return_tensors="np")["input_ids"]))
        except ValueError as exc:
            raise MediaRefused(index, str(exc)) from None
    arrays = _arrays(processor(text=[mark * len(images)], images=images, return_tensors="np"))
    joined = _bare(processor, arrays.pop("input_ids"))
    arrays.pop("attention_mask", None)
    if len(images) == 1:
        runs = [joined]
    else:
        if [t for run in runs for t in run] != joined:
            raise InvalidRequest("the model's processor expands an image differently "
                                 "beside other images", param="messages")
    inner = []
    for run in runs:
        where = [i for i, t in enumerate(run) if t == image_id]
        if not where:
            raise InvalidRequest("the model's processor gave an image no image tokens",
                                 param="messages")
        inner.append((where[0], where[-1] + 1 - where[0]))
    return splice(ids, at, runs, inner, digests, {**arrays, "rule": "text"})


def _image_token_id(processor: Any) -> int:
    found = getattr(processor, "image_token_id", None)
    return int(found) if found is not None else _token_id(processor, placeholder(processor))


def _bare(processor: Any, ids: Any) -> list[int]:
    """A processor's ``input_ids`` for one text, less what its tokenizer adds to every
    text (``add_special_tokens``: a BOS before, an EOS after)."""
    out = [int(t) for t in np.asarray(ids).reshape(-1)]
    before, after = _added(_tokenizer(processor))
    if before and out[:len(before)] == before:
        out = out[len(before):]
    if after and out[-len(after):] == after:
        out = out[:-len(after)]
    return out


def _added(tok: Any) -> tuple[list[int], list[int]]:
    """The ids ``tok`` puts before and after any text (its post-processor's)."""
    plain = list(tok.encode("a", add_special_tokens=False))
    full = list(tok.encode("a"))
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return [], []
