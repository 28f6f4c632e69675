"""Core's audio decoders: WAV, MP3 and FLAC with miniaudio (no system package), and m4a,
ogg (Vorbis, Opus) and webm through ffmpeg when it is on PATH. Each gives an ``AudioItem``:
mono float32 PCM at the stream's own rate; ``resample`` brings it to a model's.

The declared channels, rate and duration are read from the header (miniaudio's
``*_get_info``, ffprobe) and checked against the limits before any sample is decoded.
miniaudio and ffmpeg-python are imported on first use: the entry point
(``mlxcel.builtin.media``) imports this module for the signatures only.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from mlxcel.media.api import AudioItem, MediaLimits, MediaRefused, check_audio_info
from mlxcel.types.media import MediaBlob

# MIME type -> the signature of its bytes (a regex matched at the first byte)
SIGNATURES: dict[str, bytes] = {
    "audio/wav": rb"RIFF.{4}WAVE",
    # an ID3v2 tag, or an MPEG audio frame sync with layer III
    "audio/mpeg": rb"(?:ID3[\x02-\x04]|\xff[\xe2\xe3\xf2\xf3\xfa\xfb])",
    "audio/flac": rb"fLaC",
}
FFMPEG_SIGNATURES: dict[str, bytes] = {
    "audio/mp4": rb".{4}ftyp(?:M4A |M4B |mp4|iso|dash|MSNV)",
    "audio/ogg": rb"OggS",
    "audio/webm": rb"\x1a\x45\xdf\xa3",
}
_INFO = {"audio/wav": "wav_get_info", "audio/mpeg": "mp3_get_info",
         "audio/flac": "flac_get_info"}


def _miniaudio() -> Any:
    import miniaudio

    return miniaudio


def _mime_of(data: bytes) -> str | None:
    import re

    return next((m for m, sig in SIGNATURES.items()
                 if re.compile(sig, re.DOTALL).match(data[:64])), None)


def decode(blob: MediaBlob, limits: MediaLimits) -> AudioItem:
    """A WAV, MP3 or FLAC blob as mono float32 PCM at its own rate."""
    import numpy as np

    ma = _miniaudio()
    mime = _mime_of(blob.data)
    if mime is None:
        raise MediaRefused("the audio is not WAV, MP3 or FLAC")
    try:
        info = getattr(ma, _INFO[mime])(blob.data)
    except ma.DecodeError:
        raise MediaRefused(f"the {mime} data could not be read (corrupt or truncated)") \
            from None
    check_audio_info(info.nchannels, info.sample_rate, info.duration, limits)
    try:
        sound = ma.decode(blob.data, output_format=ma.SampleFormat.FLOAT32, nchannels=1,
                          sample_rate=info.sample_rate)
    except ma.DecodeError:
        raise MediaRefused(f"the {mime} data could not be decoded (corrupt or truncated)") \
            from None
    pcm = np.frombuffer(sound.samples, dtype=np.float32).copy()
    _check_length(pcm, info.sample_rate, limits)
    return AudioItem(pcm=pcm, sample_rate=info.sample_rate, digest=blob.digest)


def _check_length(pcm: Any, rate: int, limits: MediaLimits) -> None:
    """What was decoded, against the limits: a header may understate the length."""
    if not pcm.size:
        raise MediaRefused("the audio holds no samples")
    if pcm.size > limits.max_seconds * rate:
        raise MediaRefused(f"the audio lasts {pcm.size / rate:.0f} s, over the limit of "
                           f"{limits.max_seconds:.0f} s")


def resample(item: AudioItem, rate: int) -> Any:
    """``item``'s samples at ``rate`` Hz (miniaudio's resampler), a float32 array."""
    import numpy as np

    if item.sample_rate == rate:
        return item.pcm
    ma = _miniaudio()
    out = ma.convert_frames(ma.SampleFormat.FLOAT32, 1, item.sample_rate,
                            item.pcm.astype(np.float32).tobytes(),
                            ma.SampleFormat.FLOAT32, 1, rate)
    return np.frombuffer(out, dtype=np.float32).copy()


def has_ffmpeg() -> bool:
    """Whether ffmpeg and ffprobe are on PATH."""
    return shutil.which("ffmpeg") is not None and shutil.which("ffprobe") is not None


def decode_ffmpeg(blob: MediaBlob, limits: MediaLimits) -> AudioItem:
    """An m4a, ogg or webm blob through ffprobe (the limits) and ffmpeg (mono float32 at
    the stream's rate); without ffmpeg on PATH a refusal that says so."""
    import numpy as np

    if not has_ffmpeg():
        raise MediaRefused("this audio format needs ffmpeg, which is not installed on the "
                           "server (WAV, MP3 and FLAC need nothing)")
    import ffmpeg

    stream = _probe(ffmpeg, blob.data)
    rate = int(stream.get("sample_rate") or 0)
    seconds = float(stream.get("duration") or 0.0)
    check_audio_info(int(stream.get("channels") or 0), rate, seconds, limits)
    with _spooled(blob.data) as path:
        try:
            out, _ = (ffmpeg.input(path).output("pipe:1", format="f32le", ac=1, ar=rate)
                      .global_args("-nostdin", "-loglevel", "error")
                      .run(capture_stdout=True, capture_stderr=True))
        except ffmpeg.Error:
            raise MediaRefused("the audio could not be decoded (corrupt or truncated)") \
                from None
    pcm = np.frombuffer(out, dtype=np.float32).copy()
    _check_length(pcm, rate, limits)
    return AudioItem(pcm=pcm, sample_rate=rate, digest=blob.digest)


@contextlib.contextmanager
def _spooled(data: bytes) -> Iterator[str]:
    """``data`` in a private temporary file: an MP4 whose index comes last cannot be read
    from a pipe."""
    with tempfile.NamedTemporaryFile(prefix="mlxcel-audio-", suffix=".bin") as f:
        f.write(data)
        f.flush()
        yield f.name


def _probe(ffmpeg: Any, data: bytes) -> dict[str, Any]:
    """The first audio stream's ffprobe fields (duration from the container if absent)."""
    import json
    import subprocess

    with _spooled(data) as path:
        cmd = ["ffprobe", "-v", "error", "-show_streams", "-show_format", "-of", "json", path]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=30, check=True)
            found = json.loads(done.stdout or b"{}")
        except (subprocess.SubprocessError, ValueError):
            raise MediaRefused("the audio could not be read (corrupt or unsupported)") \
                from None
    streams = [s for s in found.get("streams", ()) if s.get("codec_type") == "audio"]
    if not streams:
        raise MediaRefused("the file holds no audio stream")
    stream = dict(streams[0])
    stream.setdefault("duration", (found.get("format") or {}).get("duration"))
    return stream
