"""The ``transcribe`` runner (``mlxcel.families.speech``): Whisper's long-form
transcription as mlx-audio's ``Model.generate`` does it, over several items at once.

Per item the rules are mlx-audio's: a log-mel of the audio with 30 s of padding, the
language detected from the first 30 s window when not given, then 30 s windows from a
``seek`` position; each window decoded with timestamps under the temperature ladder
(0.0, 0.2, ... 1.0 from the item's temperature) while the result is too repetitive
(gzip ratio > 2.4) or too improbable (mean log-probability < -1) and not silence
(no-speech probability > 0.6); segments cut at consecutive timestamp tokens, ``seek``
moved to the last timestamp; the text so far the next window's prompt, reset after a
temperature above 0.5; word times from the cross-attention alignment. The initial prompt
is the request's ``prompt``. The timestamp rules are openai-whisper's, which mlx-audio's
port slips on (``decoding``).

Batching changes where the work runs, never a result: each round encodes the current
window of every unfinished item in one encoder batch (and the language windows in one
batch before it; a window of 30 s or more is the language window itself, so its encoding
is reused), then decodes them as ``decoding.Decoder`` does.

Times are clamped to the audio's duration: a timestamp past it points into the window's
padding, where nothing was said. Each segment is emitted as soon as its window is done.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_audio.stt.models.whisper.audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
    pad_or_trim,
)
from mlx_audio.stt.models.whisper.decoding import detect_language
from mlx_audio.stt.models.whisper.timing import add_word_timestamps
from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES
from mlx_audio.stt.models.whisper.whisper import _get_end
from mlxcel.families.api import Loaded
from mlxcel.families.speech import Emit, Segment, Transcript, Transcription, Word
from mlxcel.families.tasks import TaskOptions

from mlxcel_family_whisper.decoding import Decoder, WhisperModel

PREPEND_PUNCTUATIONS = "\"'\u201c\u00bf([{-"
APPEND_PUNCTUATIONS = "\"'.\u3002,\uff0c!\uff01?\uff1f:\uff1a\u201d)]}\u3001"


@dataclass
class _Item:
    """One item's progress through its windows (mlx-audio's ``generate`` locals)."""

    index: int
    request: Transcription
    mel: mx.array
    frames: int
    duration: float
    seed: int
    language: str | None = None
    tokenizer: Any = None
    seek: int = 0
    tokens: list[int] = field(default_factory=list)
    reset_since: int = 0
    last_speech: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    cached: tuple[int, mx.array] | None = None

    @property
    def done(self) -> bool:
        return self.seek >= self.frames

    def window(self) -> tuple[mx.array, int]:
        size = min(N_FRAMES, self.frames - self.seek)
        return pad_or_trim(self.mel[self.seek:self.seek + size], N_FRAMES, axis=-2), size

    def key(self) -> tuple:
        return (self.language, self.request.task, tuple(self.tokens[self.reset_since:]))


class _Aligned:
    """The model as mlx-audio's word alignment reads it, with the window's encoder output
    already at hand (it would encode the window again)."""

    def __init__(self, model: Any, features: mx.array) -> None:
        self.model, self.features = model, features

    @property
    def alignment_heads(self) -> mx.array:
        return self.model.alignment_heads

    def forward_with_cross_qk(self, mel: mx.array, tokens: mx.array) -> tuple:
        logits, _, cross_qk = self.model.decoder(tokens, self.features[None])
        return logits, cross_qk


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else 0.0


class Transcriber:
    """Whisper's ``transcribe`` runner; ``decoder`` holds the fallback thresholds."""

    sample_rate = SAMPLE_RATE

    def __init__(self, loaded: Loaded, options: TaskOptions | None = None) -> None:
        self.model = WhisperModel(loaded.model)
        tokenizer = self.model.get_tokenizer()
        multilingual = self.model.is_multilingual
        self.languages = tuple(tokenizer.all_language_codes) if multilingual else ("en",)
        self.translates = bool(multilingual)  # an English-only model has no task token
        self.language_names = {code: LANGUAGES[code] for code in self.languages}
        self.decoder = Decoder(self.model)

    # -- batched encoder passes ------------------------------------------------------

    def _encode(self, mels: list[mx.array]) -> mx.array:
        """The encoder over a batch of 30 s windows, in the dtype mlx-audio's decoder
        expects (float16, or float32 for a model in another dtype)."""
        features = self.model.encoder(mx.stack(mels).astype(self.model.dtype))
        features = features.astype(mx.float16 if self.decoder.fp16 else mx.float32)
        mx.eval(features)
        return features

    def _detect(self, items: list[_Item]) -> None:
        """The language of each item that has none, from its first 30 s."""
        if not self.model.is_multilingual:
            for item in items:
                item.language = "en"
            return
        if not items:
            return
        features = self._encode([pad_or_trim(i.mel, N_FRAMES, axis=-2) for i in items])
        _, probs = detect_language(self.model, features, self.model.get_tokenizer())
        for k, item in enumerate(items):
            item.language = max(probs[k], key=probs[k].get)
            if item.frames >= N_FRAMES:  # the first window is this very window
                item.cached = (0, features[k])

    # -- a window's result into segments (mlx-audio's generate loop body) ------------

    def _advance(self, item: _Item, result: Any, features: mx.array, mel: mx.array,
                 size: int) -> list[Segment]:
        """Cut ``result`` into segments, move ``seek``; the new segments."""
        tok = item.tokenizer
        if self.decoder.skips(result):
            item.seek += size
            return []
        input_stride = N_FRAMES // self.model.dims.n_audio_ctx
        precision = input_stride * HOP_LENGTH / SAMPLE_RATE
        offset = float(item.seek * HOP_LENGTH / SAMPLE_RATE)
        seek = item.seek

        def segment(start: float, end: float, tokens: np.ndarray) -> dict:
            tokens = tokens.tolist()
            return {"seek": seek, "start": float(start), "end": float(end),
                    "text": tok.decode([t for t in tokens if t < tok.eot]),
                    "tokens": tokens, "temperature": result.temperature,
                    "avg_logprob": result.avg_logprob,
                    "compression_ratio": result.compression_ratio,
                    "no_speech_prob": result.no_speech_prob}

        tokens = np.array(result.tokens, dtype=np.int64)
        stamps = tokens >= tok.timestamp_begin
        single_ending = stamps[-2:].tolist() == [False, True]
        consecutive = (np.where(stamps[:-1] & stamps[1:])[0] + 1).tolist()
        current = []
        if consecutive:
            slices = consecutive + ([len(tokens)] if single_ending else [])
            last = 0
            for cut in slices:
                part = tokens[last:cut]
                current.append(segment(offset + (part[0] - tok.timestamp_begin) * precision,
                                       offset + (part[-1] - tok.timestamp_begin) * precision,
                                       part))
                last = cut
            if single_ending:
                item.seek += size
            else:
                item.seek += int(tokens[last - 1] - tok.timestamp_begin) * input_stride
        else:
            duration = size * HOP_LENGTH / SAMPLE_RATE
            times = tokens[stamps]
            if len(times) > 0 and times[-1] != tok.timestamp_begin:
                duration = (times[-1] - tok.timestamp_begin) * precision
            current.append(segment(offset, offset + duration, tokens))
            item.seek += size
        if item.request.words:
            add_word_timestamps(segments=current, model=_Aligned(self.model, features),
                                tokenizer=tok, mel=mel, num_frames=size,
                                prepend_punctuations=PREPEND_PUNCTUATIONS,
                                append_punctuations=APPEND_PUNCTUATIONS,
                                last_speech_timestamp=item.last_speech)
            end = _get_end(current)
            if not single_ending and end is not None and end > offset:
                item.seek = round(end * FRAMES_PER_SECOND)
            if end is not None:
                item.last_speech = end
        new = []
        for seg in current:
            if seg["start"] == seg["end"] or seg["text"].strip() == "":
                seg.update(text="", tokens=[], words=[])
            item.tokens.extend(seg["tokens"])
            new.append(self._segment(item, len(item.segments) + len(new), seg))
        if result.temperature > 0.5:
            item.reset_since = len(item.tokens)
        item.segments.extend(new)
        return new

    @staticmethod
    def _segment(item: _Item, number: int, seg: dict) -> Segment:
        def clamp(t: float) -> float:
            return round(min(max(float(t), 0.0), item.duration), 3)

        words = tuple(Word(str(w["word"]), clamp(w["start"]), clamp(w["end"]))
                      for w in seg.get("words") or ())
        start = clamp(seg["start"])
        return Segment(id=number, start=start, end=max(start, clamp(seg["end"])),
                       text=seg["text"], tokens=tuple(int(t) for t in seg["tokens"]),
                       temperature=_finite(seg["temperature"]),
                       avg_logprob=_finite(seg["avg_logprob"]),
                       compression_ratio=_finite(seg["compression_ratio"]),
                       no_speech_prob=_finite(seg["no_speech_prob"]), words=words)

    # -- the contract ----------------------------------------------------------------

    def _start(self, index: int, request: Transcription) -> _Item:
        pcm = np.ascontiguousarray(request.pcm, dtype=np.float32).reshape(-1)
        mel = log_mel_spectrogram(mx.array(pcm), n_mels=self.model.dims.n_mels,
                                  padding=N_SAMPLES)
        return _Item(index=index, request=request, mel=mel, frames=mel.shape[-2] - N_FRAMES,
                     duration=len(pcm) / SAMPLE_RATE, seed=zlib.crc32(pcm.tobytes()),
                     language=request.language)

    def transcribe(self, items: Sequence[Transcription], emit: Emit) -> list[Transcript]:
        work = [self._start(i, request) for i, request in enumerate(items)]
        self._detect([item for item in work if item.language is None])
        for item in work:
            item.tokenizer = self.model.get_tokenizer(language=item.language,
                                                      task=item.request.task)
            if item.request.prompt and item.request.prompt.strip():
                item.tokens = item.tokenizer.encode(" " + item.request.prompt.strip())
        while active := [item for item in work if not item.done]:
            windows = [item.window() for item in active]
            fresh = [k for k, item in enumerate(active)
                     if item.cached is None or item.cached[0] != item.seek]
            encoded = self._encode([windows[k][0] for k in fresh]) if fresh else None
            features = [item.cached[1] if item.cached is not None else None
                        for item in active]
            for n, k in enumerate(fresh):
                features[k] = encoded[n]
            for item in active:
                item.cached = None
            results = self.decoder.round(active, features)
            for item, feats, (mel, size), result in zip(active, features, windows, results,
                                                        strict=True):
                for seg in self._advance(item, result, feats, mel, size):
                    emit(item.index, seg)
        return [Transcript(text="".join(s.text for s in item.segments).strip(),
                           language=item.language or "en", duration=item.duration,
                           segments=tuple(item.segments)) for item in work]


def make(loaded: Loaded, options: TaskOptions | None = None) -> Transcriber:
    return Transcriber(loaded, options)
