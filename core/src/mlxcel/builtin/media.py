"""Builtin plugin: core's image decoder (PNG, JPEG, GIF, WebP, BMP on Pillow) and audio
decoders (WAV, MP3, FLAC on miniaudio; m4a, ogg, webm through ffmpeg), registered through
the same entry point (``media-builtin``) as a third party's decoder, so ``--plugins`` and
``--disable-plugins`` treat them alike. Pillow, miniaudio and ffmpeg are used on the first
item, never imported here."""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.media import audio, image
from mlxcel.media.api import MediaDecoder


@hookimpl
def mlxcel_register_media_decoders(registry) -> None:
    registry.add(MediaDecoder(name="pillow", kind="image", mimes=dict(image.SIGNATURES),
                              decode="mlxcel.media.image:decode"))
    registry.add(MediaDecoder(name="miniaudio", kind="audio", mimes=dict(audio.SIGNATURES),
                              decode="mlxcel.media.audio:decode"))
    registry.add(MediaDecoder(name="ffmpeg-audio", kind="audio",
                              mimes=dict(audio.FFMPEG_SIGNATURES),
                              decode="mlxcel.media.audio:decode_ffmpeg"))
