"""A chat prompt's media parts: which model takes them, fetching and decoding them, the
template's view of a message with media, and the prompt's expansion by the decoder.

Order, and why: the parts are counted and checked against the model's media kinds
before any fetch (a text-only model gets 501 and nothing is fetched); fetching is async,
on the event loop, under the fetch policy (``mlxcel.media.fetch``); decoding and the
processor's expansion are CPU work, run where the prompt is rendered (off the loop for a
large body, ``dialects.prepare``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from mlxcel.errors import CapabilityNotSupported, InvalidRequest
from mlxcel.families.media import MediaRefused
from mlxcel.media.api import MediaLimits
from mlxcel.media.decode import check_image_count, decode_media
from mlxcel.media.fetch import FetchPolicy, blob_from_base64, fetch
from mlxcel.types.media import MediaBlob, MediaPrompt
from mlxcel.types.messages import MediaPart, Message, TextPart

# the request's media knobs a decoder may read (``expand_media``'s ``options``)
MEDIA_OPTIONS = ("max_soft_tokens",)


class Fetched(msgspec.Struct, frozen=True):
    """One media part, fetched: its path in the request, its kind and its bytes."""

    part: str
    kind: str
    blob: MediaBlob


class MediaInput(msgspec.Struct, frozen=True):
    """A request's fetched media, what ``chat.prompt.prompt_input`` needs to decode and
    expand them: the decoder registry, the limits and the request's media options."""

    fetched: list[Fetched]
    registry: Any
    limits: MediaLimits
    options: dict[str, Any] = {}
    recent: Any = None  # the server's decoded images (``mlxcel.media.recent``), or None

    def decode(self) -> list[Any]:
        return decode_all(self.fetched, self.registry, self.limits, self.recent)


def kind_of(part: MediaPart) -> str:
    return part.__struct_config__.tag  # "image", "audio" or "video"


def media_parts(messages: tuple[Message, ...]) -> list[tuple[str, MediaPart]]:
    """Every media part with its path in the client's request (``MediaPart.path``, else
    ``messages[0].content[1]``), in prompt order."""
    return [(part.path or f"messages[{i}].content[{j}]", part)
            for i, message in enumerate(messages)
            for j, part in enumerate(message.content or ())
            if isinstance(part, MediaPart)]


def check_media(parts: list[tuple[str, MediaPart]], kinds: tuple[str, ...],
                max_images: int) -> None:
    """Refuse, before any fetch, a part of a kind the model does not take (501 naming it,
    in the client's vocabulary), a part with no source (400) and more images than
    ``--max-images`` (400)."""
    for path, part in parts:
        kind = kind_of(part)
        shown = part.wire_type or kind
        if kind not in kinds:
            takes = f"{' and '.join(kinds)} and text" if kinds else "text only"
            raise CapabilityNotSupported(
                f"{kind} input is not supported: the loaded model accepts {takes}; {path} "
                f"is '{shown}'", param=path)
        if part.url is None and part.data is None:
            raise InvalidRequest(f"{path}: the '{shown}' part has no source: give a URL "
                                 "or a data: URI ('url'), or base64 'data'", param=path)
    check_image_count(sum(kind_of(p) == "image" for _, p in parts), max_images)


async def fetch_media(parts: list[tuple[str, MediaPart]], policy: FetchPolicy
                      ) -> list[Fetched]:
    """The parts' bytes under ``policy``, fetched concurrently; the first refusal wins."""
    async def one(path: str, part: MediaPart) -> Fetched:
        if part.url is not None:
            blob = await fetch(part.url, policy, path)
        else:
            blob = blob_from_base64(part.data or "", _declared(part.format), path,
                                    max_bytes=policy.max_bytes)
        return Fetched(path, kind_of(part), blob)

    return list(await asyncio.gather(*(one(path, part) for path, part in parts)))


def _declared(fmt: str | None) -> str:
    """A part's ``format`` (a MIME type, or a bare extension such as ``png``) as a type."""
    if not fmt:
        return ""
    return fmt if "/" in fmt else f"image/{fmt.lower().lstrip('.')}"


def decode_all(fetched: list[Fetched], registry: Any, limits: MediaLimits,
               recent: Any = None) -> list[Any]:
    """Each fetched part decoded into its item (``mlxcel.media.decode``); ``recent``: the
    images decoded lately, reused for the same bytes."""
    return [decode_media(f.blob, f.kind, registry, limits, f.part, recent) for f in fetched]


def template_content(message: Message) -> list[dict[str, Any]]:
    """A message's content as Hugging Face templates read typed content: text parts and
    ``{"type": "image"}`` (``audio``, ``video``) where each item goes."""
    out: list[dict[str, Any]] = []
    for part in message.content or ():
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        else:
            out.append({"type": kind_of(part)})
    return out


def lift_tool_media(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """Media in tool results (Anthropic's ``tool_result`` images) move to a user message
    right after the run of tool messages: templates print a tool message's content as a
    string, and a user turn is where every VLM template prints an image."""
    out: list[Message] = []
    lifted: list[Any] = []
    for message in messages:
        if message.role != "tool" and lifted:
            out.append(Message(role="user", content=tuple(lifted)))
            lifted = []
        if message.role == "tool" and any(isinstance(p, MediaPart)
                                          for p in message.content or ()):
            text = tuple(p for p in message.content or () if not isinstance(p, MediaPart))
            lifted.extend(p for p in message.content or () if isinstance(p, MediaPart))
            message = msgspec.structs.replace(message, content=text or (TextPart(text=""),))
        out.append(message)
    if lifted:
        out.append(Message(role="user", content=tuple(lifted)))
    return tuple(out)


def expand(model: Any, ids: list[int], items: list[Any], options: dict[str, Any],
           marks: tuple[tuple[int, str], ...], parts: tuple[str, ...] = (),
           param: str = "messages") -> tuple[MediaPrompt, tuple[tuple[int, str], ...]]:
    """The decoder's expansion of ``ids`` (``families.media``), and the cache marks moved
    by the tokens each item added before them. ``parts``: each item's path in the
    request, which a refusal names (400): the one the decoder named, or the only one,
    else ``param``."""
    try:
        prompt = model.expand_media(ids, items, {k: v for k, v in options.items()
                                                 if k in MEDIA_OPTIONS})
    except ValueError as exc:
        index = exc.index if isinstance(exc, MediaRefused) else 0 if len(items) == 1 else None
        where = parts[index] if index is not None and index < len(parts) else None
        kind = getattr(items[index], "kind", "media") if where is not None else "media"
        reason = exc.reason if isinstance(exc, MediaRefused) else str(exc)
        raise InvalidRequest(f"{where or param}: the model's processor cannot take "
                             f"this {kind}: {reason}", param=where or param) from None
    moved = tuple((position + sum(added for at, added in prompt.grown if at < position), kind)
                  for position, kind in marks)
    return prompt, moved
