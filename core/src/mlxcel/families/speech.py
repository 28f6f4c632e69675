"""The speech tasks' runner contracts: ``transcribe`` (speech to text: Whisper) and
``speak`` (text to speech: Kokoro), made by a family's task factory
(``make(loaded, options) -> runner``, as for ``embed``; ``mlxcel.families.tasks``).

Core decodes every upload (``mlxcel.media.audio``: WAV, MP3 and FLAC with miniaudio, the
rest through ffmpeg) into mono float32 PCM at the runner's ``sample_rate`` before the
runner sees it, checks the spec's limits, renders the response formats (json, text,
verbose_json, srt, vtt; wav, pcm and ffmpeg's encodings) and streams; a runner only turns
audio into text or text into audio.

Both run on the engine thread only, through the job lane (``EngineClient.call``), each
call with a batch that may hold several requests' items; ``emit(index, piece)`` hands a
piece of item ``index``'s result to its request as soon as it exists (a transcript
``Segment``, a chunk of PCM), so a streamed response starts before the whole item is done.
A runner calls it from the engine thread, in order per item; core makes it thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import msgspec

Emit = Callable[[int, Any], None]


class Transcription(msgspec.Struct, frozen=True, kw_only=True):
    """One audio to transcribe. ``pcm``: mono float32 NumPy samples at the runner's
    ``sample_rate``. ``task``: ``transcribe`` (the spoken language) or ``translate`` (to
    English). ``language``: an ISO-639-1 code, None to detect it. ``prompt``: text the
    audio follows (earlier words, spellings). ``temperature``: 0 starts greedy (and falls
    back to higher temperatures where the model's decoding does); ``words``: word-level
    timestamps wanted."""

    pcm: Any
    task: Literal["transcribe", "translate"] = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False


class Word(msgspec.Struct, frozen=True):
    word: str
    start: float
    end: float


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of the transcript, times in seconds from the audio's start; the other
    fields are Whisper's own (OpenAI's ``verbose_json`` shows them)."""

    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: tuple[Word, ...] = ()


class Transcript(msgspec.Struct, frozen=True, kw_only=True):
    """A whole transcription: its text, the language spoken (detected or given), the
    audio's duration in seconds, and its segments in order."""

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...] = ()


class Transcriber(Protocol):
    """The ``transcribe`` task's runner. ``sample_rate``: the rate core resamples audio to
    (Whisper: 16000). ``languages``: the codes it knows (a request naming another is a
    400). ``translates``: whether it can translate to English. ``language_names``: code ->
    the lowercase English name OpenAI's ``verbose_json`` shows (``"en": "english"``);
    a code it lacks is shown as the code."""

    sample_rate: int
    languages: tuple[str, ...]
    translates: bool
    language_names: dict[str, str]

    def transcribe(self, items: Sequence[Transcription], emit: Emit) -> list[Transcript]:
        """One ``Transcript`` per item, in order; each ``Segment`` also ``emit``-ted as it
        is decoded. Engine thread."""
        ...


class Utterance(msgspec.Struct, frozen=True, kw_only=True):
    """One text to speak: ``text`` (at most 4096 characters, checked by core), ``voice``
    (one of the runner's ``voices``, or two joined by a comma to mix them), ``speed``
    (1.0 is the voice's own pace)."""

    text: str
    voice: str
    speed: float = 1.0


class Speaker(Protocol):
    """The ``speak`` task's runner. ``sample_rate``: its output rate (Kokoro: 24000).
    ``voices``: the voice names it has; ``default_voice``: the one a request without a
    voice gets (``af_heart`` where it exists)."""

    sample_rate: int
    voices: tuple[str, ...]
    default_voice: str

    def speak(self, items: Sequence[Utterance], emit: Emit) -> list[int]:
        """Synthesize each item, ``emit``-ting its audio as mono float32 NumPy chunks in
        order (a chunk per sentence or segment, so the first is sent before the rest is
        made); returns each item's sample count. Engine thread."""
        ...
