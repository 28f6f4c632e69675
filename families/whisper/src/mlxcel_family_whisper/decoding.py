"""Decoding a round of 30 s windows: mlx-audio's ``DecodingTask`` under its temperature
fallback, batched where that changes no result.

- The greedy first try of the windows that share a language, a task and a prompt runs as
  one batch: mlx-audio's decoder takes a batch under one set of options and decodes each
  row as it would alone.
- A sampled try (temperature > 0) runs alone, under a random key drawn from the item's
  audio, its position and the temperature, so an item samples the same tokens whatever
  it is batched with; the global random stream then goes on from a seed drawn from it
  before, so no one else replays the item's key.
- A window falls back to the next temperature, as mlx-audio's ``generate`` does, while
  its result is too repetitive (gzip ratio above 2.4) or too improbable (mean
  log-probability below -1), unless it is silence (no-speech probability above 0.6).

Two changes to mlx-audio's timestamp rules, which are openai-whisper's with two slips
(``TimestampRules`` is openai-whisper's own):

- "timestamps never go backwards" masks the timestamp tokens below the last one; mlx-audio
  masks up to the last one's position in the sequence, a slice that is always empty, so
  its segments may end before they start;
- "when the timestamps together are likelier than any text token, emit a timestamp"
  reads the log-probabilities after the other masks; mlx-audio reads them before, so
  right after a timestamp pair (text must follow) mass that was masked away can still
  mask the text, leaving every token at ``-inf``: decoding then picks token 0 with a NaN
  score that no fallback threshold catches.
"""

from __future__ import annotations

import zlib
from functools import cached_property
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_audio.stt.models.whisper.decoding import (
    ApplyTimestampRules,
    DecodingOptions,
    DecodingTask,
)
from mlx_audio.stt.models.whisper.whisper import HFTokenizerWrapper

LADDER_STEP = 0.2


def ladder(temperature: float) -> tuple[float, ...]:
    """The temperatures tried in turn: from ``temperature`` up to 1.0 by 0.2 (mlx-audio's
    default ladder from 0)."""
    if temperature >= 1.0:
        return (float(temperature),)
    return tuple(round(float(t), 2)
                 for t in np.arange(temperature, 1.0 + 1e-6, LADDER_STEP))


_DERIVED = ("eot", "timestamp_begin", "sot", "sot_lm", "no_timestamps", "no_speech",
            "transcribe", "translate", "sot_prev", "language_token", "sot_sequence",
            "sot_sequence_including_notimestamps", "task_token", "all_language_tokens",
            "all_language_codes", "non_speech_tokens")


class Tokenizer(HFTokenizerWrapper):
    """mlx-audio's tokenizer wrapper with its derived ids computed once: it derives them
    on every read (``no_speech`` reads the whole vocabulary), and decoding reads them at
    every window's setup."""


for _name in _DERIVED:
    _cached = cached_property(getattr(HFTokenizerWrapper, _name).fget)
    _cached.__set_name__(Tokenizer, _name)
    setattr(Tokenizer, _name, _cached)


class WhisperModel:
    """mlx-audio's Whisper ``Model`` as decoding reads it, with one ``Tokenizer`` per
    language and task."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.tokenizers: dict[tuple, Tokenizer] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def get_tokenizer(self, language: str | None = None, task: str = "transcribe") -> Any:
        key = (language, task)
        if key not in self.tokenizers:
            self.tokenizers[key] = Tokenizer(
                self.model._processor.tokenizer, multilingual=self.model.is_multilingual,
                num_languages=self.model.num_languages, language=language, task=task)
        return self.tokenizers[key]


class TimestampRules(ApplyTimestampRules):
    """openai-whisper's timestamp rules (module docstring)."""

    def apply(self, logits: mx.array, tokens: mx.array) -> mx.array:
        tb, eot = self.tokenizer.timestamp_begin, self.tokenizer.eot
        mask = np.zeros(logits.shape, np.float32)
        if self.tokenizer.no_timestamps is not None:
            mask[:, self.tokenizer.no_timestamps] = -np.inf
        rows = tokens.tolist()
        for k, row in enumerate(rows):
            seq = row[self.sample_begin:]
            last = len(seq) >= 1 and seq[-1] >= tb
            penultimate = len(seq) < 2 or seq[-2] >= tb
            if last:
                if penultimate:  # a pair just closed: text next
                    mask[k, tb:] = -np.inf
                else:  # a segment's end: another timestamp or EOT
                    mask[k, :eot] = -np.inf
            stamps = [v for v in seq if v >= tb]
            if stamps:  # never backwards; a segment's start may repeat the last end
                floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
                mask[k, tb:floor] = -np.inf
        if len(rows[0]) == self.sample_begin:
            mask[:, :tb] = -np.inf
            if self.max_initial_timestamp_index is not None:
                mask[:, tb + self.max_initial_timestamp_index + 1:] = -np.inf
        masked = logits + mx.array(mask)
        logprobs = masked - mx.logsumexp(masked, axis=-1, keepdims=True)
        stamp_mass = logprobs[:, tb:].logsumexp(axis=-1, keepdims=True)
        best_text = logprobs[:, :tb].max(axis=-1, keepdims=True)
        text = mx.where(stamp_mass > best_text, -mx.inf, masked[:, :tb])
        return mx.concatenate([text, masked[:, tb:]], axis=-1)


class Decoder:
    """A model's window decoding; the thresholds are mlx-audio's defaults (None turns one
    off, as in ``generate``)."""

    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6

    def __init__(self, model: WhisperModel) -> None:
        self.model = model
        self.fp16 = model.dtype == mx.float16

    def run(self, features: mx.array, options: DecodingOptions) -> list[Any]:
        """mlx-audio's ``DecodingTask`` on a batch of encoded windows ``[B, ctx, dims]``."""
        task = DecodingTask(self.model, options)
        task.logit_filters = [
            TimestampRules(f.tokenizer, f.sample_begin, f.max_initial_timestamp_index)
            if isinstance(f, ApplyTimestampRules) else f for f in task.logit_filters]
        return task.run(features)

    def options(self, item: Any, temperature: float) -> DecodingOptions:
        return DecodingOptions(task=item.request.task, language=item.language,
                               temperature=temperature, fp16=self.fp16,
                               prompt=item.tokens[item.reset_since:])

    def sample(self, item: Any, features: mx.array, temperature: float) -> Any:
        """One sampled try under the item's own key (module docstring)."""
        resume = int(mx.random.randint(0, 2**31 - 1, ()).item())
        mx.random.seed(zlib.crc32(f"{item.seed}:{item.seek}:{temperature}".encode()))
        try:
            return self.run(features[None], self.options(item, temperature))[0]
        finally:
            mx.random.seed(resume)

    def needs_fallback(self, result: Any) -> bool:
        improbable = self.logprob_threshold is not None and \
            result.avg_logprob < self.logprob_threshold
        fallback = improbable or (self.compression_ratio_threshold is not None and
                                  result.compression_ratio > self.compression_ratio_threshold)
        if self.no_speech_threshold is not None and improbable and \
                result.no_speech_prob > self.no_speech_threshold:
            fallback = False  # silence
        return fallback

    def skips(self, result: Any) -> bool:
        """Whether the window is silence: likely no speech, and not probable enough to
        be speech anyway."""
        if self.no_speech_threshold is None:
            return False
        skip = result.no_speech_prob > self.no_speech_threshold
        if self.logprob_threshold is not None and result.avg_logprob > self.logprob_threshold:
            skip = False
        return skip

    def round(self, items: list[Any], features: list[mx.array]) -> list[Any]:
        """Each item's result for its current window, fallback done."""
        results: list[Any] = [None] * len(items)
        groups: dict[tuple, list[int]] = {}
        for k, item in enumerate(items):
            first = ladder(item.request.temperature)[0]
            if first == 0:
                groups.setdefault(item.key(), []).append(k)
            else:
                results[k] = self.sample(item, features[k], first)
        for keys in groups.values():
            batch = mx.stack([features[k] for k in keys])
            out = self.run(batch, self.options(items[keys[0]], 0.0))
            for k, result in zip(keys, out, strict=True):
                results[k] = result
        for k, item in enumerate(items):
            for t in ladder(item.request.temperature)[1:]:
                if not self.needs_fallback(results[k]):
                    break
                results[k] = self.sample(item, features[k], t)
        return results
