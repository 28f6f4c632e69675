"""The ``transcribe`` runner on tiny random-weight checkpoints: the same segments as
mlx-audio's own ``generate`` on the same model, the temperature fallback, segments emitted
window by window, and openai-whisper's timestamp rules where mlx-audio's slip."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from mlx_audio.stt.models.whisper import decoding as mlx_audio_decoding
from mlxcel.families.speech import Transcript, Transcription
from mlxcel.testing.speech_conformance import synthetic_speech
from mlxcel_family_whisper.decoding import Decoder, TimestampRules, ladder
from mlxcel_family_whisper.runner import Transcriber

RATE = 16000


def _reference(runner: Transcriber, item: Transcription, monkeypatch) -> Transcript:
    """mlx-audio's ``Model.generate`` on the runner's model, with openai-whisper's
    timestamp rules patched in, as a Transcript."""
    monkeypatch.setattr(mlx_audio_decoding, "ApplyTimestampRules", TimestampRules)
    out = runner.model.model.generate(
        item.pcm, language=item.language, task=item.task, temperature=0.0,
        compression_ratio_threshold=None, logprob_threshold=None,
        initial_prompt=item.prompt, word_timestamps=item.words, fp16=False)
    span = SimpleNamespace(duration=len(item.pcm) / RATE)
    segments = tuple(Transcriber._segment(span, s["id"], s) for s in out.segments)
    return Transcript(text="".join(s.text for s in segments).strip(), language=out.language,
                      duration=span.duration, segments=segments)


def test_segments_match_mlx_audio_s_generate(whisper_checkpoint, greedy, monkeypatch):
    runner = greedy(whisper_checkpoint("hf"))
    items = [Transcription(pcm=synthetic_speech(RATE, 3.0, seed=1)),
             Transcription(pcm=synthetic_speech(RATE, 35.0, seed=2), language="en",
                           prompt="the quiet river", words=True),
             Transcription(pcm=synthetic_speech(RATE, 5.0, seed=3), language="de",
                           task="translate")]
    got = runner.transcribe(items, lambda i, piece: None)
    for item, transcript in zip(items, got, strict=True):
        ref = _reference(runner, item, monkeypatch)
        assert transcript.language == ref.language and transcript.text == ref.text
        assert [(s.start, s.end, s.text, s.tokens, s.words) for s in transcript.segments] \
            == [(s.start, s.end, s.text, s.tokens, s.words) for s in ref.segments]
        assert [s.avg_logprob for s in transcript.segments] == pytest.approx(
            [s.avg_logprob for s in ref.segments], abs=1e-4)
    assert got[1].segments[-1].end > 30  # the long item took more than one window
    assert any(s.words for s in got[1].segments)
    assert got[2].segments[0].tokens  # translated


def test_the_temperature_ladder_runs_as_mlx_audio_s(transcriber):
    """Random weights fail every threshold, so each window ends at the ladder's last
    temperature; a request's temperature starts the ladder; sampling is reproducible."""
    assert ladder(0.0) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0) and ladder(0.5) == (0.5, 0.7, 0.9)
    runner = transcriber("hf")
    items = [Transcription(pcm=synthetic_speech(RATE, 2.0, seed=4)),
             Transcription(pcm=synthetic_speech(RATE, 2.0, seed=5), temperature=0.5)]
    first = runner.transcribe(items, lambda i, p: None)
    assert {s.temperature for s in first[0].segments} == {1.0}
    assert {s.temperature for s in first[1].segments} == {0.9}
    _same(runner.transcribe(items[::-1], lambda i, p: None)[::-1], first)
    _same(runner.transcribe(items[:1], lambda i, p: None), first[:1])


def _same(got, want):
    """Equal transcripts: text, language, every segment's tokens, times and temperature
    exactly; the scores to float tolerance (a batch of another size sums in another order)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.text, a.language, a.duration) == (b.text, b.language, b.duration)
        assert [(s.start, s.end, s.text, s.tokens, s.temperature, s.words) for s in a.segments] \
            == [(s.start, s.end, s.text, s.tokens, s.temperature, s.words) for s in b.segments]
        for x, y in zip(a.segments, b.segments, strict=True):
            assert (x.avg_logprob, x.compression_ratio, x.no_speech_prob) == pytest.approx(
                (y.avg_logprob, y.compression_ratio, y.no_speech_prob), abs=1e-4)


def test_fallback_and_silence_rules():
    decoder = Decoder(SimpleNamespace(dtype=mx.float32))

    def result(cr=1.0, lp=-0.5, ns=0.0):
        return SimpleNamespace(compression_ratio=cr, avg_logprob=lp, no_speech_prob=ns)

    assert not decoder.needs_fallback(result())
    assert decoder.needs_fallback(result(cr=2.5)) and decoder.needs_fallback(result(lp=-1.5))
    assert not decoder.needs_fallback(result(lp=-1.5, ns=0.7))  # silence: no retry
    assert decoder.skips(result(lp=-1.5, ns=0.7)) and not decoder.skips(result(ns=0.7))


def test_segments_are_emitted_window_by_window(whisper_checkpoint, greedy, monkeypatch):
    runner = greedy(whisper_checkpoint("hf"))
    rounds, seen = [], []
    real = runner.decoder.round
    monkeypatch.setattr(runner.decoder, "round",
                        lambda items, feats: rounds.append(1) or real(items, feats))
    items = [Transcription(pcm=synthetic_speech(RATE, 65.0, seed=6), language="en"),
             Transcription(pcm=synthetic_speech(RATE, 2.0, seed=7))]
    out = runner.transcribe(items, lambda i, seg: seen.append((i, seg.id, len(rounds))))
    assert len(rounds) >= 3 and seen[0][2] == 1  # the first window's segments come first
    for i, transcript in enumerate(out):
        assert [s for k, s, _ in seen if k == i] == [s.id for s in transcript.segments]
    assert seen[-1][2] == len(rounds) > seen[0][2]


class _Tok(SimpleNamespace):
    timestamp_begin, eot, no_timestamps = 10, 8, 9


def _apply(rules, seq, logits):
    return np.array(rules.apply(mx.array([logits], dtype=mx.float32), mx.array([seq])))[0]


def test_timestamp_rules_are_openai_whisper_s():
    vocab = 20
    ours = TimestampRules(_Tok(), sample_begin=1, max_initial_timestamp_index=None)
    theirs = mlx_audio_decoding.ApplyTimestampRules(_Tok(), 1, None)
    stamps_likely = [0.0] * 10 + [5.0] * 10  # every timestamp likelier than any text
    after_pair = [0, 12, 3, 14, 14]  # sot, <|t2|> text <|t4|><|t4|>: text must follow
    assert np.isneginf(_apply(theirs, after_pair, stamps_likely)).all()  # mlx-audio: nothing
    kept = _apply(ours, after_pair, stamps_likely)
    assert np.isfinite(kept[:8]).all() and np.isneginf(kept[10:]).all()
    ended = [0, 12, 3, 15]  # a segment ends at <|t5|>: no earlier timestamp may follow
    theirs_ended, ours_ended = _apply(theirs, ended, [0.0] * vocab), _apply(ours, ended,
                                                                             [0.0] * vocab)
    assert np.isfinite(theirs_ended[10:15]).all()  # mlx-audio lets time go backwards
    assert np.isneginf(ours_ended[10:15]).all() and np.isfinite(ours_ended[15:]).all()
