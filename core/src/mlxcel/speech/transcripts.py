"""A ``Transcript`` in OpenAI's transcription formats: ``json``, ``text``,
``verbose_json`` (segments, and words when asked), ``srt`` and ``vtt``."""

from __future__ import annotations

import math
from typing import Any

from mlxcel.errors import InvalidRequest
from mlxcel.families.speech import Segment, Transcript

FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")


def check_format(fmt: str, param: str = "response_format") -> str:
    if fmt not in FORMATS:
        raise InvalidRequest(f"'{param}' must be one of {', '.join(FORMATS)}, not {fmt!r}",
                             param=param)
    return fmt


def usage(transcript: Transcript) -> dict[str, Any]:
    """OpenAI's duration usage: whole seconds of audio, rounded up."""
    return {"type": "duration", "seconds": math.ceil(transcript.duration)}


def render(transcript: Transcript, fmt: str, task: str, names: dict[str, str],
           words: bool) -> tuple[Any, str]:
    """(body, media type) of ``transcript`` in ``fmt``; ``names``: language code -> the
    name ``verbose_json`` shows (OpenAI writes ``english``); ``words``: include them."""
    if fmt == "json":
        return {"text": transcript.text, "usage": usage(transcript)}, "application/json"
    if fmt == "text":
        return transcript.text + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        return srt(transcript.segments), "text/plain; charset=utf-8"
    if fmt == "vtt":
        return vtt(transcript.segments), "text/vtt; charset=utf-8"
    # a translation's language is its output's, English, as OpenAI's verbose_json says
    language = "english" if task == "translate" else \
        names.get(transcript.language, transcript.language)
    body: dict[str, Any] = {
        "task": task, "language": language,
        "duration": round(transcript.duration, 2), "text": transcript.text,
        "segments": [_segment(s) for s in transcript.segments], "usage": usage(transcript)}
    if words:
        body["words"] = [{"word": w.word, "start": round(w.start, 2), "end": round(w.end, 2)}
                         for s in transcript.segments for w in s.words]
    return body, "application/json"


def _segment(s: Segment) -> dict[str, Any]:
    return {"id": s.id, "seek": int(s.start * 100), "start": round(s.start, 2),
            "end": round(s.end, 2), "text": s.text, "tokens": list(s.tokens),
            "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}


def _clock(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: tuple[Segment, ...]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm`` times."""
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: tuple[Segment, ...]) -> str:
    """WebVTT: the header, then ``HH:MM:SS.mmm`` cues."""
    return "WEBVTT\n\n" + "".join(
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
        for s in segments)
