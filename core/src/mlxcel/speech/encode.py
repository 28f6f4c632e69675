"""Synthesized audio (mono float32 chunks) in the speech route's formats: ``wav`` (16-bit
PCM) and ``pcm`` (raw 16-bit little-endian) always; ``mp3``, ``opus``, ``aac`` and
``flac`` through an ffmpeg process when ffmpeg is on PATH, else a 400 that says so.

Every format streams: a WAV header with the RIFF sizes left open (what a player reading
a stream expects), then samples as they come; ffmpeg's output is read while its input is
still being written.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.media.audio import has_ffmpeg

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
               "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> ffmpeg's muxer and codec arguments
FFMPEG = {"mp3": ("mp3", ("-c:a", "libmp3lame", "-b:a", "128k")),
          "opus": ("ogg", ("-c:a", "libopus", "-b:a", "64k")),
          "aac": ("adts", ("-c:a", "aac", "-b:a", "128k")),
          "flac": ("flac", ("-c:a", "flac"))}
OPEN = 0xFFFFFFFF  # a RIFF size a streamed WAV does not know yet


def check_format(fmt: str) -> str:
    """``fmt`` if the server can write it: a 400 for an unknown one, and for an ffmpeg
    one when ffmpeg is not installed."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"'response_format' must be one of {', '.join(FORMATS)}, not "
                             f"{fmt!r}", param="response_format")
    if fmt in FFMPEG and not has_ffmpeg():
        raise InvalidRequest(f"'response_format' {fmt} needs ffmpeg, which is not installed "
                             "on this server; ask for wav or pcm", param="response_format")
    return fmt


def pcm16(chunk: Any) -> bytes:
    """Float samples in [-1, 1] as 16-bit little-endian integers (clipped)."""
    import numpy as np

    return (np.clip(np.asarray(chunk, dtype=np.float32), -1.0, 1.0) * 32767).astype(
        "<i2").tobytes()


def wav_header(rate: int, samples: int | None = None) -> bytes:
    """A 16-bit mono WAV header; ``samples`` None leaves the sizes open (streamed)."""
    data = OPEN if samples is None else samples * 2
    riff = OPEN if samples is None else 36 + data
    return b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", data)


async def encoded(chunks: AsyncIterator[Any], fmt: str, rate: int) -> AsyncIterator[bytes]:
    """``chunks`` (float arrays) as ``fmt`` bytes, as they come."""
    if fmt == "pcm":
        async for chunk in chunks:
            yield pcm16(chunk)
        return
    if fmt == "wav":
        yield wav_header(rate)
        async for chunk in chunks:
            yield pcm16(chunk)
        return
    async for part in _ffmpeg(chunks, fmt, rate):
        yield part


async def _ffmpeg(chunks: AsyncIterator[Any], fmt: str, rate: int) -> AsyncIterator[bytes]:
    muxer, codec = FFMPEG[fmt]
    proc = await asyncio.create_subprocess_exec(
        "ffmpeg", "-nostdin", "-loglevel", "error", "-f", "s16le", "-ar", str(rate), "-ac",
        "1", "-i", "pipe:0", *codec, "-f", muxer, "pipe:1",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    async def feed() -> None:
        try:
            async for chunk in chunks:
                proc.stdin.write(pcm16(chunk))
                await proc.stdin.drain()
        finally:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.close()

    feeder = asyncio.ensure_future(feed())
    try:
        while part := await proc.stdout.read(1 << 15):
            yield part
        await feeder  # its error (the job's: 503, 504, a failed runner) surfaces here
    finally:
        feeder.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
