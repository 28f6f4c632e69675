"""The family served by the real app: a Kokoro checkpoint alone (``-m``: audio only, chat
answers 501) and beside a chat model (``--tts-model``), its WAV at 24 kHz, a streamed body,
and a voice the checkpoint lacks refused with a 400 that lists its voices."""

from __future__ import annotations

import io
import wave

from mlxcel.testing.engine import app_client

SPEECH = "/v1/audio/speech"


def _wav(body: bytes) -> tuple[int, int, int]:
    with wave.open(io.BytesIO(body)) as w:
        return w.getframerate(), w.getnchannels(), w.getnframes()


def test_kokoro_alone_is_an_audio_only_server(kokoro_checkpoint):
    with app_client(kokoro_checkpoint) as c:
        spoken = c.post(SPEECH, json={"input": "Hi. Bye!", "voice": "bf_emma"})
        unknown = c.post(SPEECH, json={"input": "Hi.", "voice": "zz_nobody"})
        chat = c.post("/v1/chat/completions", json={"messages": []})
    assert spoken.status_code == 200, spoken.text
    rate, channels, frames = _wav(spoken.content)
    assert (rate, channels) == (24000, 1) and frames > 0
    assert unknown.status_code == 400 and "af_heart" in unknown.json()["error"]["message"]
    assert chat.status_code == 501 and SPEECH in chat.json()["error"]["message"]


def test_tts_model_beside_a_chat_model_streams_pcm(tiny_checkpoint, kokoro_checkpoint):
    with app_client(tiny_checkpoint, tts_model=str(kokoro_checkpoint)) as c:
        with c.stream("POST", SPEECH, json={"input": "Hi. Bye!", "response_format": "pcm",
                                            "stream_format": "audio", "speed": 2.0}) as r:
            assert r.status_code == 200
            parts = [p for p in r.iter_bytes() if p]
        chat = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert parts and sum(len(p) for p in parts) % 2 == 0  # 16-bit samples
    assert chat.status_code == 200
