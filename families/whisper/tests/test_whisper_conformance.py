"""The runner passes mlxcel's ``transcribe`` conformance runner (languages, times within
the audio, emit order, batch invariance) on a multilingual and an English-only checkpoint.
Greedy runners: random weights fail every fallback threshold, so each window would be
decoded six times (``test_whisper_runner`` checks the fallback's batch invariance)."""

from __future__ import annotations

from mlxcel.families.speech import Transcription
from mlxcel.testing.conformance import check_transcriber
from mlxcel.testing.speech_conformance import synthetic_speech


def test_the_runner_conforms(whisper_checkpoint, greedy):
    check_transcriber(greedy(whisper_checkpoint("hf")))


def test_an_english_only_model_conforms(whisper_checkpoint, greedy):
    runner = greedy(whisper_checkpoint("hf", multilingual=False))
    check_transcriber(runner)
    out = runner.transcribe([Transcription(pcm=synthetic_speech(16000, 1.0))],
                            lambda i, p: None)
    assert out[0].language == "en"
