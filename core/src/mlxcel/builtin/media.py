"""Builtin plugin: core's image decoder (PNG, JPEG, GIF, WebP, BMP on Pillow), registered
through the same entry point (``media-builtin``) as a third party's decoder, so
``--plugins`` and ``--disable-plugins`` treat it alike. Pillow is imported on the first
image, never here."""

from __future__ import annotations

from mlxcel import hookimpl
from mlxcel.media import image
from mlxcel.media.api import MediaDecoder


@hookimpl
def mlxcel_register_media_decoders(registry) -> None:
    registry.add(MediaDecoder(name="pillow", kind="image", mimes=dict(image.SIGNATURES),
                              decode="mlxcel.media.image:decode"))
