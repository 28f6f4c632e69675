"""The image processor's output for the images seen lately, kept by each image's digest.

The processor's resizing and normalisation of an image runs on the request's thread,
before the engine sees the prompt, and the engine's caches (the vision features, the
prompt's prefix) skip the tower and the prefill, not this. Agents send the whole
conversation every turn, its images included, so each turn would redo it for every image
in it. The processors of the ``grid`` and ``sequence`` rules (``mlxcel_family_vlm.media``)
process each image on its own and stack the images' arrays on their first axis
(Qwen-VL's patches and grid rows, Gemma 3's pixel tensors), so one image's arrays are
kept under its digest (core's ``mlxcel.media.recent.Recent``) and a prompt's images are
joined from them: the arrays the processor gives for all of them at once. Images of the
``text`` rule are processed with the prompt's text and are not kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlxcel.families.media import MediaRefused
from mlxcel.media.recent import Recent

SIZE = 32  # images kept
BUDGET = 256 << 20  # their arrays' bytes together (float32 pixels: a 1080p screenshot's
# are ~50 MB for Qwen-VL)

Arrays = dict[str, np.ndarray]


class ProcessedImages:
    """The ``grid``/``sequence`` processors' arrays per image digest (module docstring)."""

    def __init__(self, size: int = SIZE) -> None:
        self.kept: Recent[Arrays] = Recent(size, BUDGET,
                                           lambda arrays: sum(v.nbytes for v in arrays.values()))

    def arrays(self, processor: Any, images: list[Any], digests: tuple[bytes, ...]) -> Arrays:
        """``processor.image_processor``'s arrays for ``images`` (with ``digests``), each
        image's from this cache or processed alone, joined on the first axis."""
        parts = []
        for index, (image, digest) in enumerate(zip(images, digests, strict=True)):
            try:
                parts.append(self.kept.get(digest,
                                           lambda image=image: _processed(processor, image)))
            except ValueError as exc:  # e.g. Qwen-VL's bound on an image's aspect ratio
                raise MediaRefused(index, str(exc)) from None
        if len(parts) == 1:
            return dict(parts[0])
        return {key: np.concatenate([part[key] for part in parts], axis=0) for key in parts[0]}


def _processed(processor: Any, image: Any) -> Arrays:
    out = processor.image_processor(images=[image], return_tensors="np")
    arrays = {k: np.asarray(v) for k, v in dict(out).items() if v is not None}
    for value in arrays.values():
        value.flags.writeable = False  # shared by every later prompt with this image
    return arrays
