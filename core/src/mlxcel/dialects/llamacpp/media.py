"""llama-server's multimodal prompt form on ``/completion``: a prompt object
``{"prompt_string": "... <__media__> ...", "multimodal_data": ["<base64>", ...]}``, alone
or in a list of prompts, as llama-server reads it (``tokenize_input_subprompt``).

Each ``<__media__>`` marker is where the entry of ``multimodal_data`` of the same rank
goes: core puts the model's own placeholder there (``media_placeholder("image")``, what
its chat template prints for an image), tokenizes the text as llama-server does (the
tokenizer's BOS, special tokens parsed), and the decoder expands each placeholder into
the image's tokens (``chat.media.expand``), as for a chat turn's image.

Order: the shapes, the model's media kinds (501 on a text-only model, nothing decoded),
the marker counts and ``--max-images`` are checked on the event loop; the base64 decode,
the image decode (``--max-image-payload-size``, the pixel bounds) and the expansion run
where the prompt is tokenized (``dialects.prepare``). Entries are raw base64, as
llama-server takes them; a ``data:`` URI is read too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel.chat.media import Fetched, MediaInput, check_media, expand, kind_of, media_parts
from mlxcel.context import AppContext
from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.families.media import media_kinds
from mlxcel.media.api import MediaLimits
from mlxcel.media.decode import check_image_count
from mlxcel.media.fetch import blob_from_base64
from mlxcel.types.media import MediaPrompt
from mlxcel.types.messages import PromptRequest

MARKER = "<__media__>"  # llama-server's (mtmd's) default media marker
DATA_KEY = "multimodal_data"


@dataclass(frozen=True)
class RawMedia:
    """One prompt's media as sent: its text (markers in place), its base64 entries, and
    the prompt's path in the request (``prompt``, ``prompt[1]``)."""

    text: str
    data: tuple[str, ...]
    param: str


def raw_media(prompt: Any, param: str) -> RawMedia | None:
    """A prompt object's media, its shape checked; None when it has none (a string, ids,
    an object without ``multimodal_data`` or with an empty list)."""
    if not isinstance(prompt, dict) or prompt.get(DATA_KEY) in (None, []):
        return None
    data = prompt[DATA_KEY]
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise InvalidRequest(f"'{param}.{DATA_KEY}' must be a list of base64 strings",
                             param=f"{param}.{DATA_KEY}")
    text = prompt.get("prompt_string")
    if not isinstance(text, str):
        raise InvalidRequest(f"'{param}' as an object needs a string 'prompt_string'",
                             param=f"{param}.prompt_string")
    return RawMedia(text, tuple(data), param)


def prompt_params(prompts: list[Any]) -> list[str]:
    """Each prompt's path: ``prompt`` for one, ``prompt[i]`` in a list of prompts."""
    return ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]


def gather(ctx: AppContext, prompts: list[Any]) -> list[RawMedia | None]:
    """Each prompt's media, checked before anything is decoded: a model that takes no
    images refuses them (501), each prompt has one marker per entry (400), and the request
    holds at most ``--max-images`` (400)."""
    raws = [raw_media(p, param) for p, param in zip(prompts, prompt_params(prompts),
                                                    strict=True)]
    sent = [raw for raw in raws if raw is not None]
    if not sent:
        return raws
    model = ctx.checkpoint.model
    if "image" not in media_kinds(model):
        raise CapabilityNotSupported(
            f"image input is not supported: the loaded model accepts text only; "
            f"'{sent[0].param}' has {DATA_KEY}", param=f"{sent[0].param}.{DATA_KEY}")
    placeholder = model.media_placeholder("image")
    for raw in sent:
        found = raw.text.count(MARKER)
        if found != len(raw.data):
            raise InvalidRequest(
                f"'{raw.param}.prompt_string' has {found} {MARKER} marker(s) for "
                f"{len(raw.data)} {DATA_KEY} entries: put one marker where each goes",
                param=f"{raw.param}.{DATA_KEY}")
        if placeholder and placeholder in raw.text:
            raise InvalidRequest(
                f"'{raw.param}.prompt_string' holds the model's image placeholder "
                f"{placeholder!r} itself; put {MARKER} where each image goes",
                param=f"{raw.param}.prompt_string")
    check_image_count(sum(len(raw.data) for raw in sent), ctx.settings.max_images,
                      param="prompt")
    return raws


def _blob(entry: str, part: str, max_bytes: int) -> Any:
    """An entry's bytes: raw base64, or a ``data:<type>;base64,`` URI."""
    mime = ""
    if entry.startswith("data:"):
        head, _, payload = entry.partition(",")
        if not head.endswith(";base64"):
            raise InvalidRequest(f"{part}: a data: URI here must be base64 "
                                 "('data:<type>;base64,...')", param=part)
        mime, entry = head[len("data:"):].split(";", 1)[0], payload
    return blob_from_base64(entry, mime, part, max_bytes=max_bytes)


def media_input(ctx: AppContext, raw: RawMedia, options: dict[str, Any]) -> MediaInput:
    """The prompt's entries as fetched media (decoded from base64 under
    ``--max-image-payload-size``), named ``prompt.multimodal_data[j]`` in any refusal."""
    settings = ctx.settings
    fetched = [Fetched(part, "image", _blob(entry, part, settings.max_image_payload_size))
               for j, entry in enumerate(raw.data)
               for part in (f"{raw.param}.{DATA_KEY}[{j}]",)]
    return MediaInput(fetched, ctx.plugins.media_decoders, MediaLimits.of(settings),
                      options, ctx.decoded)


def expanded(ctx: AppContext, raw: RawMedia, options: dict[str, Any],
             encode: Any) -> MediaPrompt:
    """The prompt with its images (blocking work: run it through ``prepare``): the
    entries decoded, the markers made the model's placeholders, the text tokenized by
    ``encode(text, param)``, and each placeholder expanded into its image's tokens."""
    media = media_input(ctx, raw, options)
    items = media.decode()
    model = ctx.checkpoint.model
    text = raw.text.replace(MARKER, model.media_placeholder("image"))
    parts = tuple(f.part for f in media.fetched)
    try:
        prompt, _ = expand(model, list(encode(text, raw.param)), items, options, (),
                           parts, raw.param)
    except InvalidRequest as exc:
        if exc.param != "messages":  # an image the processor refused, named
            raise
        # placeholders the text held besides the markers
        param = f"{raw.param}.prompt_string"
        raise InvalidRequest(f"'{param}': {exc.message}; put {MARKER} where each image "
                             "goes, and nothing else of the model's image tokens",
                             param=param) from None
    return prompt


def props(model: Any) -> dict[str, Any]:
    """``/props``' media fields, as llama-server has them: ``modalities`` (what the model
    takes besides text) and, where it takes images, the ``media_marker`` of the
    multimodal prompt form."""
    kinds = media_kinds(model)
    marker = {"media_marker": MARKER} if "image" in kinds else {}
    return {"modalities": {"vision": "image" in kinds, "audio": "audio" in kinds}, **marker}


# -- /apply-template --------------------------------------------------------------------------
def template_media(ctx: AppContext, prompt: PromptRequest) -> list[str]:
    """The kinds of the chat request's media parts, in order, checked as a chat turn
    checks them (a model that does not take them: 501; ``--max-images``: 400); nothing is
    fetched, since the template only prints where each goes."""
    parts = media_parts(prompt.messages)
    if parts:
        check_media(parts, media_kinds(ctx.checkpoint.model), ctx.settings.max_images)
    return [kind_of(part) for _, part in parts]


def with_markers(ctx: AppContext, text: str, kinds: list[str]) -> str:
    """The rendered prompt with a ``<__media__>`` marker where each image goes, as
    llama-server's ``/apply-template`` answers (its chat templates see the marker as
    text), so that the prompt goes back to ``/completion`` with its images as
    ``multimodal_data``: each of the model's image placeholders becomes a marker. A
    render whose placeholders are not one per image (or that has other media) is
    returned as the template printed it."""
    if not kinds or any(kind != "image" for kind in kinds):
        return text
    placeholder = ctx.checkpoint.model.media_placeholder("image")
    if not placeholder or text.count(placeholder) != len(kinds):
        return text
    return text.replace(placeholder, MARKER)
