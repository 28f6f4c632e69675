"""Media decoder contract v2: a fetched blob (``mlxcel.types.media.MediaBlob``) becomes a
typed item, an image, video frames or PCM audio, that a family's processor reads.

A ``MediaDecoder`` names the formats it takes, each with the signature that identifies
it in the bytes, and its ``decode(blob, limits) -> item`` as a ``"module:attr"`` string,
imported on first use. Core picks the decoder from the bytes, never from the declared
MIME type alone (``mlxcel.media.decode``), and ships one for PNG, JPEG, GIF, WebP and
BMP (``mlxcel.media.image``, on Pillow). Nothing here imports Pillow or NumPy.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from mlxcel.errors import InvalidRequest

MediaKind = Literal["image", "video", "audio"]
MEDIA_KINDS: tuple[str, ...] = ("image", "video", "audio")

# the default decoded-pixel bound: Pillow's own decompression-bomb threshold
MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3
MAX_SIDE = 16384  # --max-image-width / --max-image-height's default
MAX_SECONDS = 600.0  # audio: the spec's limits
MAX_CHANNELS = 8
MAX_SAMPLE_RATE = 192_000


class MediaLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a decoder may decode, checked on the size a blob's header declares before any
    pixel is decoded (``check_image_size``), so that a small file declaring a huge image
    (a decompression bomb) is refused for nothing. ``max_width`` / ``max_height``:
    ``--max-image-width`` / ``--max-image-height``; ``max_pixels``: width times height,
    per image or video frame."""

    max_width: int = MAX_SIDE
    max_height: int = MAX_SIDE
    max_pixels: int = MAX_PIXELS
    # audio: the spec's bounds, checked on what the stream's header declares
    max_seconds: float = MAX_SECONDS
    max_channels: int = MAX_CHANNELS
    max_sample_rate: int = MAX_SAMPLE_RATE

    @classmethod
    def of(cls, settings: Any) -> MediaLimits:
        """The limits a ``Settings`` gives (``max_image_width``, ``max_image_height``)."""
        return cls(max_width=settings.max_image_width, max_height=settings.max_image_height)


class ImageItem(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded image: ``image`` is a ``PIL.Image.Image`` in mode ``RGB`` (EXIF
    orientation applied, alpha composited on white) of ``width`` x ``height``. ``digest``
    is the blob's: the vision cache and the prompt cache key on it."""

    kind: ClassVar[str] = "image"
    image: Any
    width: int
    height: int
    digest: bytes


class VideoItem(msgspec.Struct, frozen=True, kw_only=True):
    """Decoded video frames, in order: ``PIL.Image.Image``s in mode ``RGB``, all of one
    size, sampled at ``fps`` frames per second of the clip. ``digest``: the blob's."""

    kind: ClassVar[str] = "video"
    frames: list[Any]
    fps: float
    digest: bytes


class AudioItem(msgspec.Struct, frozen=True, kw_only=True):
    """Decoded audio: ``pcm`` is a one-dimensional float32 NumPy array (mono, in
    [-1, 1]) at ``sample_rate`` Hz. ``digest``: the blob's."""

    kind: ClassVar[str] = "audio"
    pcm: Any
    sample_rate: int
    digest: bytes


MediaItem = ImageItem | VideoItem | AudioItem
ITEM_TYPES: dict[str, type] = {"image": ImageItem, "video": VideoItem, "audio": AudioItem}


class MediaDecoder(msgspec.Struct, frozen=True, kw_only=True):
    """A media decoder plugin (contract v2).

    ``kind``: what it decodes (``MEDIA_KINDS``). ``mimes``: each MIME type it takes, with
    the signature that identifies the format: a bytes regular expression matched at the
    blob's first byte (``re.DOTALL``, over its first ``SNIFF_BYTES``), e.g.
    ``{"image/png": rb"\\x89PNG\\r\\n\\x1a\\n"}``. ``decode``: ``"module:attr"`` of
    ``decode(blob: MediaBlob, limits: MediaLimits) -> ImageItem | VideoItem | AudioItem``
    (the item of its ``kind``, carrying ``blob.digest``). It checks the size the header
    declares with ``check_image_size`` before it decodes a pixel, and raises
    ``MediaRefused`` (or any exception, for bytes it cannot read) to refuse a blob.

    ``priority``: among the decoders of a kind whose signatures match a blob, the highest
    takes it (core's are 0), so a plugin may take over a format core decodes. Two
    decoders of one kind and priority that list one MIME type are a startup error.
    """

    name: str
    kind: MediaKind
    mimes: dict[str, bytes]
    decode: str
    priority: int = 0


class MediaRefused(InvalidRequest):
    """A decoder refuses a blob (over a limit, or not readable as its format). The message
    is shown to the user, so it states the reason and never quotes the bytes; core
    prefixes the content part it came from (``messages[0].content[1]``)."""


def check_image_size(width: int, height: int, limits: MediaLimits) -> None:
    """Refuse an image (or video frame) whose size is over ``limits``; a decoder calls it
    with the size its header declares, before decoding, so a bomb is never decoded."""
    if width <= 0 or height <= 0:
        raise MediaRefused(f"the image declares an empty size ({width}x{height})")
    _refuse_over(
        (width, limits.max_width, f"the image is {width} pixels wide, over "
         f"--max-image-width ({limits.max_width})"),
        (height, limits.max_height, f"the image is {height} pixels high, over "
         f"--max-image-height ({limits.max_height})"),
        (width * height, limits.max_pixels, f"the image is {width}x{height} "
         f"({width * height} pixels), over the limit of {limits.max_pixels} decoded pixels "
         "per image"))


def check_audio_info(channels: int, sample_rate: int, seconds: float,
                     limits: MediaLimits) -> None:
    """Refuse audio whose declared channels, rate or duration is over ``limits``; an
    audio decoder calls it with what the stream's header says, before decoding."""
    if channels <= 0 or sample_rate <= 0:
        raise MediaRefused("the audio declares no channels or no sample rate")
    _refuse_over(
        (channels, limits.max_channels, f"the audio has {channels} channels, over the "
         f"limit of {limits.max_channels}"),
        (sample_rate, limits.max_sample_rate, f"the audio's sample rate is {sample_rate} "
         f"Hz, over the limit of {limits.max_sample_rate} Hz"),
        (seconds, limits.max_seconds, f"the audio lasts {seconds:.0f} s, over the limit "
         f"of {limits.max_seconds:.0f} s"))


def _refuse_over(*bounds: tuple[float, float, str]) -> None:
    """Refuse with the message of the first ``(value, limit, message)`` over its limit."""
    for value, limit, message in bounds:
        if value > limit:
            raise MediaRefused(message)
