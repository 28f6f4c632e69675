"""M-RoPE positions of an image prompt, computed on the host.

Qwen2-VL and Qwen2.5-VL give every token three rotary positions (time, height, width).
A text token's three are equal: one more than the position before it. An image's tokens
take their place in the image's grid of merged patches (its frame, its row and its
column), offset by the position where the image starts; the text after it continues from
one past the image's largest. The rope delta is how far the last position runs past the
token count: a row's decode steps add it to their offsets.

mlx-vlm's ``get_rope_index`` computes the same with MLX ops and reads its intermediate
values back (``tolist``, ``item``): on a GPU each read waits for the device, and the
engine calls it when it admits an image row, while decode steps may be in flight.
``mrope_positions`` is the same rule on the token ids and the processor's grids, which
are host data already; ``VisionLanguageModel`` uses it for the model types it mirrors
(``HOST_RULE``), and a test checks it against ``get_rope_index`` on each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# model types whose language model's get_rope_index this module mirrors, for images
HOST_RULE = ("qwen2_vl", "qwen2_5_vl")


def mrope_positions(token_ids: Sequence[int], grids: np.ndarray, merge: int,
                    image_token: int, vision_start: int) -> tuple[np.ndarray, int]:
    """([3, n] int32 positions, rope delta) of a prompt whose images are the runs of
    ``image_token`` that follow ``vision_start``, in order, with ``grids`` [images, 3]
    (frames, height and width in patches, before merging ``merge`` x ``merge``)."""
    ids = list(token_ids)
    n = len(ids)
    images = sum(1 for a, b in zip(ids, ids[1:], strict=False)
                 if a == vision_start and b == image_token)
    out = np.empty((3, n), dtype=np.int32)
    st = nxt = 0
    for k in range(images):
        ed = ids.index(image_token, st)
        out[:, st:ed] = nxt + np.arange(ed - st)
        t, h, w = (int(v) for v in grids[k])
        gh, gw = h // merge, w // merge
        count = t * gh * gw
        base = nxt + ed - st
        out[0, ed:ed + count] = base + np.repeat(np.arange(t), gh * gw)
        out[1, ed:ed + count] = base + np.tile(np.repeat(np.arange(gh), gw), t)
        out[2, ed:ed + count] = base + np.tile(np.arange(gw), t * gh)
        nxt = int(out[:, ed:ed + count].max()) + 1
        st = ed + count
    out[:, st:] = nxt + np.arange(n - st)
    return out, int(out.max()) + 1 - n if n else 0
