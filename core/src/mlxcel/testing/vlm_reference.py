"""What an image row must equal, for a vision family's tests: mlx-vlm's own generate loop
(greedy, on the family's expanded prompt), its own forward on its processor's inputs, and
the same rows run alone when they decode beside text rows. mlx-vlm, numpy and Pillow are
imported on use: they are a family's dependencies, not core's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxcel.testing.engine import engine_for, media_request, request, run, solo_tokens

# one user turn: an image part, then a question
ONE_IMAGE = [{"role": "user", "content": [{"type": "image"},
                                          {"type": "text", "text": "What is in the picture?"}]}]


def ramp_image(width: int = 56, height: int = 56) -> Any:
    """A deterministic RGB PIL image (a byte ramp), the same on every machine."""
    import numpy as np
    from PIL import Image

    pixels = (np.arange(width * height * 3) % 251).astype(np.uint8)
    return Image.fromarray(pixels.reshape(height, width, 3))


def noise_item(seed: int, width: int = 56, height: int = 56) -> Any:
    """An image item of seeded random pixels, as a request's PNG becomes one: encoded and
    decoded by core's own Pillow decoder (``mlxcel.media.image``)."""
    import io

    import numpy as np
    from PIL import Image

    from mlxcel.media.api import MediaLimits
    from mlxcel.media.image import decode
    from mlxcel.types.media import MediaBlob

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return decode(MediaBlob.of(out.getvalue(), "image/png", "data"), MediaLimits())


def prompt_inputs(processor: Any, images: Sequence[Any]) -> tuple[str, Any]:
    """The chat template's prompt for ``ONE_IMAGE``, and the processor's inputs for it."""
    text = processor.tokenizer.apply_chat_template(ONE_IMAGE, add_generation_prompt=True,
                                                   tokenize=False)
    return text, processor(text=[text], images=images)


def forward(model: Any, inputs: Any) -> Any:
    """mlx-vlm's own path: the ids, the pixels and the processor's other outputs; the
    logits."""
    extra = {k: v for k, v in inputs.items()
             if k not in ("input_ids", "pixel_values", "attention_mask")}
    return model(inputs["input_ids"], pixel_values=inputs["pixel_values"],
                 mask=inputs.get("attention_mask"), **extra).logits


def mlx_vlm_greedy(module: Any, prompt: Any, n: int, pixels: Any = None,
                   **extra: Any) -> list[int]:
    """``n`` greedy tokens of mlx-vlm's ``generate_step`` on ``prompt`` (a
    ``MediaPrompt``) with ``module`` (mlx-vlm's model): its ``inputs`` as the model's
    inputs (``pixels`` instead of its ``pixel_values`` when given), ``extra`` beside."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step

    arrays = {k: mx.array(v) for k, v in (prompt.inputs or {}).items()
              if k not in ("rule", "pixel_values")}
    if pixels is None:
        pixels = mx.array(prompt.inputs["pixel_values"])
    out: list[int] = []
    for token, _ in generate_step(mx.array(prompt.token_ids)[None], module, pixels, None,
                                  max_tokens=n, temperature=0.0, **arrays, **extra):
        out.append(int(token))
        if len(out) == n:
            break
    return out


def rows_beside_text(path: Any, prompts: Sequence[Any], text: Sequence[Sequence[int]],
                     max_tokens: int = 10) -> tuple[list[list[int]], list[list[int]]]:
    """(batched, alone): each image row's (``prompts``) and text row's greedy tokens when
    all decode together (image rows between text rows, ``--parallel`` all of them), and
    each alone; image rows first in both."""
    images = [media_request(p, max_tokens) for p in prompts]
    texts = [request(list(t), max_tokens) for t in text]
    order = [r for pair in zip(texts, images, strict=False) for r in pair] + \
        texts[len(images):] + images[len(texts):]
    engine = engine_for(path, parallel=len(order), chunk=16)
    try:
        together = dict(zip(map(id, order), (t for t, _ in run(engine, order)), strict=True))
    finally:
        engine.shutdown()
    alone = dict(zip(map(id, order), solo_tokens(path, order), strict=True))
    mine = [*images, *texts]
    return [together[id(r)] for r in mine], [alone[id(r)] for r in mine]


def one_at_a_time(path: Any, prompts: Sequence[Any], max_tokens: int = 4,
                  ) -> list[tuple[list[int], Any, tuple[int, int]]]:
    """Each media prompt alone, in order, on one engine with a prompt cache: its greedy
    tokens, its last event (``usage.cached_tokens``) and the feature cache's (misses,
    hits) once it is done; so a test sees which prompt reused what."""
    engine = engine_for(path, parallel=2, cache=True, chunk=16)
    out = []
    try:
        for prompt in prompts:
            (tokens, last), = run(engine, [media_request(prompt, max_tokens)])
            features = engine.worker.features
            out.append((tokens, last, (features.misses, features.hits)))
    finally:
        engine.shutdown()
    return out


def feed_rows(monkeypatch: Any) -> list[int]:
    """How many rows each prefill chunk of image rows held, in order (a spy on
    ``mlxcel.engine.media_rows.MediaFeed``, undone with ``monkeypatch``): a test's
    evidence that image rows prefilled together (a 2) or alone (only 1s)."""
    from mlxcel.engine import media_rows

    rows: list[int] = []
    original = media_rows.MediaFeed.__call__

    def call(self: Any, tokens: Any, cache: Any, starts: list[int]) -> Any:
        rows.append(tokens.shape[0])
        return original(self, tokens, cache, starts)

    monkeypatch.setattr(media_rows.MediaFeed, "__call__", call)
    return rows
