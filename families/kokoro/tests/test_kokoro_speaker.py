"""The ``speak`` runner on the tiny random-weight checkpoint: audio streamed a sentence at
a time (the first chunk before the last is made), batches taking turns, voices (default,
mixes, unknown and unavailable ones), speed, and no network at any point. Inputs are a
few phonemes: a CPU synthesizes slowly."""

from __future__ import annotations

import socket

import mlx.core as mx
import numpy as np
import pytest
from mlxcel.errors import InvalidRequest
from mlxcel.families.api import LoadOptions
from mlxcel.families.speech import Utterance
from mlxcel_family_kokoro import g2p
from mlxcel_family_kokoro.load import KokoroCheckpoint, load
from mlxcel_family_kokoro.speaker import KokoroSpeaker, make


class Counting:
    """The model, counting its calls: which sentence is being made when a chunk is sent."""

    def __init__(self, module):
        self.module, self.calls = module, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.module(*args, **kw)


def test_rate_voices_and_the_default_voice(speaker, kokoro_checkpoint):
    assert speaker.sample_rate == 24000
    assert speaker.voices == ("af_heart", "bf_emma", "ff_siwis")
    assert speaker.default_voice == "af_heart"
    files = {k: v for k, v in speaker._files.items() if k != "af_heart"}
    other = KokoroSpeaker(KokoroCheckpoint(speaker.module, kokoro_checkpoint, files))
    assert other.default_voice == "bf_emma"  # no af_heart: the first


def test_the_first_sentence_is_emitted_before_the_second_is_made(speaker, monkeypatch):
    counting = Counting(speaker.module)
    monkeypatch.setattr(speaker, "module", counting)
    made_when_emitted = []
    counts = speaker.speak([Utterance(text="Hi. Bye!", voice="af_heart")],
                           lambda i, chunk: made_when_emitted.append((i, counting.calls)))
    assert made_when_emitted == [(0, 1), (0, 2)] and counting.calls == 2 and counts[0] > 0


def test_a_batch_takes_turns_a_sentence_each(speaker):
    order = []
    speaker.speak([Utterance(text="Hi. Bye!", voice="af_heart"),
                   Utterance(text="Oui. Non!", voice="ff_siwis")],
                  lambda i, chunk: order.append(i))
    assert order == [0, 1, 0, 1]


def test_unknown_mixed_and_unavailable_voices(speaker, kokoro_checkpoint, monkeypatch):
    with pytest.raises(InvalidRequest) as err:
        speaker.speak([Utterance(text="Hi.", voice="zz_nobody")], lambda i, c: None)
    assert err.value.param == "voice" and "af_heart, bf_emma, ff_siwis" in err.value.message
    with pytest.raises(InvalidRequest, match="two joined by a comma"):
        speaker.resolve_voice("af_heart,bf_emma,ff_siwis")
    assert speaker.resolve_voice("") == ("af_heart",)
    mixed = np.array(speaker.pack("af_heart, bf_emma"))
    halves = (np.array(speaker.pack("af_heart")) + np.array(speaker.pack("bf_emma"))) / 2
    assert np.allclose(mixed, halves, atol=1e-6)
    # a Japanese pack without misaki[ja]: not offered, and named as such when asked for
    monkeypatch.setitem(g2p.EXTRAS, "j", ("no_such_misaki_ja", "JAG2P", "misaki[ja]"))
    files = {**speaker._files, "jf_alpha": speaker._files["af_heart"]}
    other = KokoroSpeaker(KokoroCheckpoint(speaker.module, kokoro_checkpoint, files))
    assert "jf_alpha" not in other.voices
    with pytest.raises(InvalidRequest, match=r"misaki\[ja\]"):
        other.resolve_voice("jf_alpha")


def test_speed_changes_the_length(speaker):
    lengths = [speaker.speak([Utterance(text="Okay.", voice="af_heart", speed=s)],
                             lambda i, c: None)[0] for s in (0.5, 2.0)]
    assert lengths[0] > lengths[1] > 0
    with pytest.raises(InvalidRequest) as err:
        speaker.speak([Utterance(text="Okay.", voice="af_heart", speed=0.0)], lambda i, c: None)
    assert err.value.param == "speed"


def test_no_network_is_touched_from_load_to_speech(kokoro_checkpoint, monkeypatch):
    """HF_HUB_OFFLINE is set, every socket connection and every Hub download fails the
    test: loading, starting the G2P and speaking fetch nothing."""
    import huggingface_hub
    from mlx_audio.tts.models.kokoro import pipeline
    from mlxcel.backend import library_env

    assert library_env().get("HF_HUB_OFFLINE") == "1"  # huggingface_hub's own variable
    attempts = []

    def refuse(*args, **kw):
        attempts.append(args[:2])
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for owner in (huggingface_hub, pipeline):
        monkeypatch.setattr(owner, "snapshot_download", refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    runner = make(load(kokoro_checkpoint, LoadOptions()))
    chunks = []
    runner.speak([Utterance(text="Okay.", voice="bf_emma")], lambda i, c: chunks.append(c))
    assert attempts == [] and chunks and chunks[0].dtype == np.float32
    assert isinstance(runner.pack("bf_emma"), mx.array)
