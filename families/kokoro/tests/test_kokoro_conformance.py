"""The family's ``speak`` runner passes mlxcel's speech conformance runner
(``check_speaker``: rate, voices, chunked float32 audio, each item's length whatever
shares its batch, a mix of two voices, an unknown voice's ``InvalidRequest``) on the tiny
random-weight checkpoint."""

from __future__ import annotations

try:
    from mlxcel.testing.conformance import check_speaker
except ImportError:  # until mlxcel.testing.conformance re-exports the speech runners
    from mlxcel.testing.speech_conformance import check_speaker


def test_the_speaker_conforms(speaker):
    check_speaker(speaker)
