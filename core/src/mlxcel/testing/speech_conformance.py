"""Speech runner conformance (``mlxcel.families.speech``): what a ``transcribe`` or
``speak`` runner must do to be served like the builtin families' (re-exported by
``mlxcel.testing.conformance``).

``check_transcriber(runner)``: the runner declares a sample rate, its language codes and
whether it translates (and, where it names them, its languages' names);
``transcribe`` returns one ``Transcript`` per item, in order, with
the audio's duration, a language it knows (the one given, or one it detected), segments
numbered in order whose times (and words' times) lie within the audio, each ending no
earlier than it starts, and text made of those segments'; every
segment is ``emit``-ted under its item's index, in order, before ``transcribe`` returns;
and an item's transcript is the same whatever else shares its batch (core batches requests
together). Each check raises ``AssertionError`` naming what failed.

``check_speaker(runner)``: the ``speak`` runner's checks (its docstring lists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mlxcel.families.speech import Segment, Transcript, Transcription

# slack on a segment's end: a decoder's last timestamp token may round past the last sample
TIME_SLACK = 0.02


def synthetic_speech(sample_rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    """Mono float32 PCM in [-1, 1]: voiced bursts (a 120-220 Hz pitch with harmonics under
    a syllable-rate envelope) over quiet noise, enough like speech for a model to decode
    something without shipping a recording."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    pitch = 120 + 100 * (0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t + seed))
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t + seed), 0, None) ** 2
    pcm = 0.3 * voiced * envelope + 0.01 * rng.standard_normal(t.shape)
    return np.clip(pcm, -1, 1).astype(np.float32)


def _clips(runner: Any) -> list[Transcription]:
    rate = runner.sample_rate
    return [Transcription(pcm=synthetic_speech(rate, 3.0, seed=1)),
            Transcription(pcm=synthetic_speech(rate, 1.5, seed=2), language="en",
                          prompt="a short clip"),
            Transcription(pcm=synthetic_speech(rate, 4.0, seed=3), words=True)]


def _check_one(runner: Any, i: int, item: Transcription, got: Any, emitted: list) -> None:
    assert isinstance(got, Transcript), f"item {i}: transcribe must return Transcripts"
    duration = len(item.pcm) / runner.sample_rate
    assert abs(got.duration - duration) <= 0.05, \
        f"item {i}: duration {got.duration}, the audio lasts {duration:.3f} s"
    assert got.language in runner.languages, \
        f"item {i}: language {got.language!r} is not one of the runner's languages"
    if item.language is not None:
        assert got.language == item.language, f"item {i}: the given language was not kept"
    for n, seg in enumerate(got.segments):
        assert isinstance(seg, Segment), f"item {i}: segments must be Segment"
        assert seg.id == n, f"item {i}: segment ids must count from 0 in order"
        assert 0.0 <= seg.start <= seg.end <= duration + TIME_SLACK, \
            f"item {i}: segment {n} ({seg.start}-{seg.end}) lies outside the audio"
        for word in seg.words:
            assert 0.0 <= word.start <= word.end <= duration + TIME_SLACK, \
                f"item {i}: a word of segment {n} lies outside the audio"
    joined = "".join(seg.text for seg in got.segments).strip()
    assert got.text.strip() == joined, f"item {i}: text is not its segments' text"
    assert list(emitted) == list(got.segments), \
        f"item {i}: emit did not see every segment in order"


class _Emitted:
    """A runner's ``emit``: what it emits, per item index (``seen``); an index outside
    the batch of ``n`` items fails the check at once."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: dict[int, list] = {i: [] for i in range(n)}

    def __call__(self, index: int, piece: Any) -> None:
        assert index in self.seen, f"emit got index {index}, the batch has {self.n} items"
        self.seen[index].append(piece)


def check_transcriber(runner: Any, items: Sequence[Transcription] | None = None) -> None:
    """Run the transcriber checks (see the module docstring) on ``items`` (default: three
    synthetic clips of 1.5 to 4 s, one with a language and a prompt, one asking for words)."""
    assert isinstance(runner.sample_rate, int) and runner.sample_rate > 0, "sample_rate"
    assert runner.languages and all(isinstance(c, str) for c in runner.languages), \
        "languages must be a non-empty tuple of codes"
    assert isinstance(runner.translates, bool), "translates must be a bool"
    names = getattr(runner, "language_names", None) or {}
    assert isinstance(names, dict) and all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in names.items()), \
        "language_names must map codes to names"
    items = list(items) if items is not None else _clips(runner)
    emit = _Emitted(len(items))
    seen = emit.seen

    together = runner.transcribe(items, emit)
    assert len(together) == len(items), "transcribe must return one Transcript per item"
    for i, (item, got) in enumerate(zip(items, together, strict=True)):
        _check_one(runner, i, item, got, seen[i])
        alone = runner.transcribe([item], lambda index, piece: None)[0]
        assert _same(alone, got), f"item {i}'s transcript changes with the batch it runs in"


def _same(a: Transcript, b: Transcript, atol: float = 1e-3) -> bool:
    """Equal text, language, tokens and times; the decoder's scores (log-probabilities,
    ratios) within ``atol``, since a batched encoder may round differently."""
    if (a.text, a.language, a.duration, len(a.segments)) != \
            (b.text, b.language, b.duration, len(b.segments)):
        return False
    for x, y in zip(a.segments, b.segments, strict=True):
        if (x.id, x.start, x.end, x.text, x.tokens, x.temperature, x.words) != \
                (y.id, y.start, y.end, y.text, y.tokens, y.temperature, y.words):
            return False
        scores = [(x.avg_logprob, y.avg_logprob), (x.compression_ratio, y.compression_ratio),
                  (x.no_speech_prob, y.no_speech_prob)]
        if any(abs(p - q) > atol for p, q in scores):
            return False
    return True


SPOKEN = ("Hi there. Bye now!", "Okay.")


def check_speaker(runner: Any, texts: Sequence[str] = SPOKEN) -> None:
    """The ``speak`` runner's conformance (``mlxcel.families.speech.Speaker``): it declares
    a sample rate, its voices and a default among them; ``speak`` returns one sample count
    per item and ``emit``-s every item's audio under its index, as non-empty mono float32
    NumPy chunks of finite samples adding up to that count; the first text (two sentences)
    comes in more than one chunk, so a stream starts before its synthesis ends; an item
    lasts as long whatever else shares its batch (voice models draw random phases, so the
    samples themselves may differ); two voices joined by a comma mix; and an unknown voice
    is an ``InvalidRequest`` on ``voice`` that lists the voices. Keep ``texts`` short: a
    CPU synthesizes slowly. Each check raises ``AssertionError`` naming what failed."""
    from mlxcel.errors import InvalidRequest
    from mlxcel.families.speech import Utterance

    assert isinstance(runner.sample_rate, int) and runner.sample_rate > 0, "sample_rate"
    voices = tuple(runner.voices)
    assert voices and all(isinstance(v, str) and "," not in v for v in voices), \
        "voices must be a non-empty tuple of names without commas"
    assert runner.default_voice in voices, "default_voice must be one of voices"
    items = [Utterance(text=t, voice=runner.default_voice) for t in texts]
    emit = _Emitted(len(items))
    seen = emit.seen

    counts = runner.speak(items, emit)
    assert len(counts) == len(items), "speak must return one sample count per item"
    for i, chunks in seen.items():
        assert chunks, f"item {i}: no audio emitted"
        for chunk in chunks:
            assert isinstance(chunk, np.ndarray) and chunk.dtype == np.float32 and \
                chunk.ndim == 1 and chunk.size, f"item {i}: chunks must be 1-D float32 arrays"
            assert np.isfinite(chunk).all(), f"item {i}: non-finite samples"
        assert sum(c.size for c in chunks) == counts[i], \
            f"item {i}: the emitted samples do not add up to the count returned"
    assert len(seen[0]) > 1, "a two-sentence text must be emitted in more than one chunk"
    alone = runner.speak([items[-1]], lambda index, piece: None)
    assert alone == [counts[-1]], "an item's length changes with the batch it runs in"
    if len(voices) > 1:
        mixed = Utterance(text=texts[-1], voice=f"{voices[0]},{voices[1]}")
        assert runner.speak([mixed], lambda index, piece: None)[0] > 0, "a mix gave no audio"
    try:
        runner.speak([Utterance(text=texts[-1], voice="no_such_voice")],
                     lambda index, piece: None)
    except InvalidRequest as exc:
        assert exc.param == "voice" and voices[0] in exc.message, \
            "an unknown voice's error must be on 'voice' and list the voices"
    else:
        raise AssertionError("an unknown voice must raise InvalidRequest")
