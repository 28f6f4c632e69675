"""Core's audio decoders through ``decode_media``: each format to mono float32 PCM at its
own rate, resampling, and the limits checked on the header before decoding."""

from __future__ import annotations

import io
import struct
import subprocess
import wave

import numpy as np
import pytest
from mlxcel.errors import InvalidRequest
from mlxcel.media import audio
from mlxcel.media.api import MediaLimits
from mlxcel.media.decode import decode_media
from mlxcel.plugins import load_plugins
from mlxcel.types.media import MediaBlob

PART = "file"


@pytest.fixture(scope="module")
def registry():
    return load_plugins().media_decoders


def tone(seconds: float = 0.5, rate: int = 16000, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.5 * np.sin(2 * np.pi * 440 * t)
    return np.repeat(mono[:, None], channels, axis=1)


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return out.getvalue()


def encoded(fmt: str, *args: str, tmp=None) -> bytes:
    """The tone in ``fmt``, encoded by ffmpeg (the CI installs it: scripts/install-sysdeps.sh),
    into a file, as a client's recorder writes one (an MP4 index at its end)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/clip"
        subprocess.run(["ffmpeg", "-v", "error", "-f", "wav", "-i", "pipe:0", *args,
                        "-f", fmt, out], input=wav_bytes(tone(1.0, 22050, 2), 22050),
                       capture_output=True, check=True, timeout=60)
        with open(out, "rb") as f:
            return f.read()


def decoded(registry, data: bytes, mime: str = "", limits: MediaLimits = MediaLimits()):
    return decode_media(MediaBlob.of(data, mime, "data"), "audio", registry, limits, PART)


def test_wav_becomes_mono_float_pcm_at_its_rate(registry):
    item = decoded(registry, wav_bytes(tone(0.5, 44100, 2), 44100), "audio/wav")
    assert item.sample_rate == 44100 and item.pcm.dtype == np.float32
    assert item.pcm.ndim == 1 and item.pcm.shape[0] == 22050
    assert 0.45 < np.abs(item.pcm).max() <= 0.51


def test_resample_keeps_the_duration(registry):
    item = decoded(registry, wav_bytes(tone(1.0, 44100), 44100))
    out = audio.resample(item, 16000)
    assert abs(out.shape[0] - 16000) <= 2 and out.dtype == np.float32
    assert audio.resample(decoded(registry, wav_bytes(tone(0.1), 16000)), 16000).shape == (1600,)


@pytest.mark.parametrize("fmt,args", [("mp3", ()), ("flac", ()), ("ogg", ("-c:a", "libopus")),
                                      ("ogg", ("-c:a", "libvorbis")), ("ipod", ("-c:a", "aac")),
                                      ("webm", ("-c:a", "libopus"))])
def test_every_format_decodes(registry, fmt, args):
    item = decoded(registry, encoded(fmt, *args))
    seconds = item.pcm.shape[0] / item.sample_rate
    assert 0.9 < seconds < 1.2, seconds
    assert np.abs(item.pcm).max() > 0.2


def test_too_many_channels_is_refused_before_decoding(registry):
    with pytest.raises(InvalidRequest, match="9 channels"):
        decoded(registry, wav_bytes(tone(0.01, 8000, 9), 8000))


def test_a_too_high_rate_is_refused(registry):
    with pytest.raises(InvalidRequest, match="sample rate"):
        decoded(registry, wav_bytes(tone(0.01, 200_000), 200_000))


def test_too_long_audio_is_refused(registry):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:  # 601 s of 8-bit 4 kHz silence: 2.4 MB
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(4000)
        w.writeframes(b"\x80" * 4000 * 601)
    with pytest.raises(InvalidRequest, match="601 s, over the limit of 600 s"):
        decoded(registry, out.getvalue())
    data = bytearray(wav_bytes(tone(0.01, 8000), 8000))
    data[40:44] = struct.pack("<I", 8000 * 2 * 601)  # a header declaring more than it has
    assert decoded(registry, bytes(data)).pcm.shape == (80,)  # what is there is decoded


def test_corrupt_and_unknown_audio_is_refused_naming_the_format(registry):
    with pytest.raises(InvalidRequest, match="audio/wav") as info:
        decoded(registry, b"RIFF\x00\x00\x00\x00WAVE" + b"\x00" * 40)
    assert info.value.param == PART
    with pytest.raises(InvalidRequest, match="no audio format|not .*audio|type"):
        decoded(registry, b"\x00" * 200)


def test_without_ffmpeg_its_formats_say_so(registry, monkeypatch):
    monkeypatch.setattr(audio, "has_ffmpeg", lambda: False)
    with pytest.raises(InvalidRequest, match="needs ffmpeg"):
        decoded(registry, encoded("ogg", "-c:a", "libopus"))
