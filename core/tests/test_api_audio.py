"""The audio routes over the job lane, with NumPy stand-ins for the models (core has no
speech family): multipart and JSON uploads, every transcript format, streaming, the
limits, 501/503/504, and speech in every format, streamed before synthesis ends."""

from __future__ import annotations

import base64
import io
import json
import threading
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from litestar.testing import TestClient
from mlxcel.app import create_app
from mlxcel.engine.lane_worker import LaneWorker
from mlxcel.engine.lanes import LaneLimits
from mlxcel.engine.side import SideEngine
from mlxcel.engines import Engines
from mlxcel.families.speech import Segment, Transcript, Word
from mlxcel.media.decode import decode_media
from mlxcel.plugins import load_plugins
from mlxcel.settings import Settings
from mlxcel.types.media import MediaBlob

STT, TTS = "/v1/audio/transcriptions", "/v1/audio/speech"


class ToneTranscriber:
    """A stand-in model: one segment per second of audio, "tone" where it is loud and
    "hush" where it is quiet; translation upper-cases; the prompt is echoed first."""

    sample_rate, translates = 16000, True
    languages = ("en", "fr")
    language_names = {"en": "english", "fr": "french"}

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.batches: list[int] = []

    def transcribe(self, items, emit) -> list[Transcript]:
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(len(items))
        out = []
        for i, item in enumerate(items):
            rate = self.sample_rate
            segments = []
            for k in range(0, len(item.pcm), rate):
                part = item.pcm[k:k + rate]
                word = "tone" if np.sqrt(np.mean(part ** 2)) > 0.1 else "hush"
                word = word.upper() if item.task == "translate" else word
                start, end = k / rate, (k + len(part)) / rate
                seg = Segment(id=len(segments), start=start, end=end, text=f" {word}",
                              words=(Word(word, start, end),) if item.words else ())
                segments.append(seg)
                emit(i, seg)
            text = (item.prompt or "") + "".join(s.text for s in segments)
            out.append(Transcript(text=text.strip(), language=item.language or "en",
                                  duration=len(item.pcm) / rate, segments=tuple(segments)))
        return out


class ToneSpeaker:
    """A stand-in model: 0.1 s of a tone per word, a chunk per sentence; ``gate`` holds
    it after its first chunk."""

    sample_rate, default_voice = 24000, "af_heart"
    voices = ("af_heart", "am_adam")

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.seen: list[Any] = []
        self.done = threading.Event()

    def speak(self, items, emit) -> list[int]:
        counts = []
        for i, item in enumerate(items):
            self.seen.append(item)
            total = 0
            for n, sentence in enumerate(s for s in item.text.split(".") if s.strip()):
                if n == 1 and self.gate is not None:
                    self.gate.wait(10)
                words = len(sentence.split())
                t = np.arange(int(0.1 * words * self.sample_rate / item.speed)) / self.sample_rate
                chunk = (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
                emit(i, chunk)
                total += chunk.size
            counts.append(total)
        self.done.set()
        return counts


def wav(seconds: float = 2.0, rate: int = 44100, loud: float = 0.5) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    pcm = loud * np.sin(2 * np.pi * 440 * t) * (t < 1.0)  # a second of tone, then quiet
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())
    return out.getvalue()


@contextmanager
def audio_app(stt: Any = None, tts: Any = None, limits: LaneLimits | None = None,
              **settings: Any) -> Iterator[TestClient]:
    worker = LaneWorker([])
    sides = {task: SideEngine(task, name, lambda r=runner: r, worker.client(),
                              limits or LaneLimits(batch_items=4))
             for task, name, runner in (("transcribe", "stt", stt), ("speak", "tts", tts))
             if runner is not None}
    worker.sides = list(sides.values())
    app = create_app(Settings(alias="audio", **settings), engines=Engines(None, sides, worker))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert worker.ready.wait(10)
        yield client


def upload(c: TestClient, path: str = STT, data: bytes | None = None, **fields: Any):
    files = {"file": ("clip.wav", wav() if data is None else data, "audio/wav")}
    return c.post(path, files=files, data=fields)


def test_multipart_json_and_text_formats():
    with audio_app(ToneTranscriber()) as c:
        plain = upload(c)
        text = upload(c, response_format="text")
        prompted = upload(c, prompt="Hi.", language="fr")
    assert plain.status_code == 200, plain.text
    assert plain.json() == {"text": "tone hush", "usage": {"type": "duration", "seconds": 2}}
    assert text.text == "tone hush\n" and text.headers["content-type"].startswith("text/plain")
    assert prompted.json()["text"] == "Hi. tone hush"


def test_verbose_json_with_words_srt_and_vtt():
    with audio_app(ToneTranscriber()) as c:
        verbose = upload(c, response_format="verbose_json",
                         **{"timestamp_granularities[]": ["word", "segment"]})
        srt = upload(c, response_format="srt")
        vtt = upload(c, response_format="vtt")
        no_verbose = upload(c, **{"timestamp_granularities[]": "word"})
    body = verbose.json()
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert body["duration"] == 2.0 and [s["text"] for s in body["segments"]] == [" tone", " hush"]
    assert body["segments"][1]["start"] == 1.0 and body["words"][0]["word"] == "tone"
    assert srt.text == "1\n00:00:00,000 --> 00:00:01,000\ntone\n\n" \
                       "2\n00:00:01,000 --> 00:00:02,000\nhush\n\n"
    assert vtt.text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\ntone\n")
    assert no_verbose.status_code == 400
    assert no_verbose.json()["error"]["param"] == "timestamp_granularities"


def test_translation_and_a_json_body_with_base64_or_a_data_uri():
    with audio_app(ToneTranscriber()) as c:
        translated = upload(c, "/v1/audio/translations", response_format="verbose_json")
        b64 = c.post("/audio/transcriptions",
                     json={"file": base64.b64encode(wav()).decode()})
        uri = c.post(STT, json={"file": "data:audio/wav;base64," + base64.b64encode(
            wav()).decode(), "response_format": "text"})
        bad = c.post(STT, json={"file": "not base64!"})
    assert translated.json()["task"] == "translate"
    assert translated.json()["text"] == "TONE HUSH"
    assert b64.json()["text"] == "tone hush" and uri.text == "tone hush\n"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "file"


def test_streamed_transcription_sends_deltas_then_done():
    with audio_app(ToneTranscriber()) as c:
        r = upload(c, stream="true")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + \
        ["transcript.text.done"]
    assert [e["delta"] for e in events[:2]] == [" tone", " hush"]
    assert events[-1]["text"] == "tone hush" and events[-1]["usage"]["seconds"] == 2


@pytest.mark.parametrize("fields,param", [
    ({"language": "xx"}, "language"), ({"response_format": "docx"}, "response_format"),
    ({"temperature": "3"}, "temperature")])
def test_bad_fields_are_400_naming_them(fields, param):
    with audio_app(ToneTranscriber()) as c:
        r = upload(c, **fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_limits_corrupt_files_and_a_missing_file():
    with audio_app(ToneTranscriber()) as c:
        big = upload(c, data=b"RIFF" + b"\x00" * (26 << 20))
        corrupt = upload(c, data=b"RIFF\x00\x00\x00\x00WAVE" + b"\x01" * 64)
        unknown = upload(c, data=b"\x07" * 512)
        none = c.post(STT, files={"other": ("x", b"1")})
        alive = upload(c)
    assert big.status_code == 413, big.text
    assert corrupt.status_code == 400 and "audio/wav" in corrupt.json()["error"]["message"]
    assert unknown.status_code == 400
    assert none.status_code == 400 and none.json()["error"]["param"] == "file"
    assert alive.status_code == 200


def test_a_full_queue_is_503_and_a_slow_model_504():
    gate = threading.Event()
    with audio_app(ToneTranscriber(gate), limits=LaneLimits(depth=1, timeout_s=1.0)) as c:
        results: list[Any] = []
        first = threading.Thread(target=lambda: results.append(upload(c)))
        first.start()
        import time

        time.sleep(0.3)
        full = upload(c)
        first.join()
        gate.set()
    assert full.status_code == 503, full.text
    assert results[0].status_code == 504, results[0].text


def test_without_the_models_the_routes_are_501_and_chat_names_them():
    with audio_app(ToneTranscriber()) as c:
        speech = c.post(TTS, json={"input": "hi"})
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user",
                                                                  "content": "hi"}]})
    assert speech.status_code == 501 and "--tts-model" in speech.json()["error"]["message"]
    assert "mlxcel-family-kokoro" in speech.json()["error"]["message"]
    assert chat.status_code == 501 and STT in chat.json()["error"]["message"]
    with audio_app(tts=ToneSpeaker()) as c:
        stt = upload(c)
    assert stt.status_code == 501 and "--stt-model" in stt.json()["error"]["message"]


def decoded(data: bytes) -> Any:
    return decode_media(MediaBlob.of(data, "", "data"), "audio",
                        load_plugins().media_decoders, __import__(
                            "mlxcel.media.api", fromlist=["MediaLimits"]).MediaLimits(), "x")


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac"])
def test_speech_in_each_format(fmt):
    speaker = ToneSpeaker()
    with audio_app(tts=speaker) as c:
        r = c.post(TTS, json={"input": "one two three. four five", "response_format": fmt})
    assert r.status_code == 200, r.text
    if fmt in ("wav", "mp3", "flac"):
        item = decoded(r.content)
        assert abs(item.pcm.shape[0] / item.sample_rate - 0.5) < 0.1
    else:
        assert len(r.content) > 100
    assert speaker.seen[0].voice == "af_heart"


def test_pcm_is_raw_16_bit_and_speed_and_mixed_voices_reach_the_model():
    speaker = ToneSpeaker()
    with audio_app(tts=speaker) as c:
        r = c.post(TTS, json={"input": "one two", "response_format": "pcm", "speed": 2.0,
                              "voice": "af_heart, am_adam"})
    assert r.headers["content-type"] == "audio/pcm"
    assert len(r.content) == 2 * int(0.1 * 2 * 24000 / 2.0)
    assert speaker.seen[0].voice == "af_heart,am_adam" and speaker.seen[0].speed == 2.0


class AlloySpeaker(ToneSpeaker):
    voices = ("af_heart", "am_adam", "af_alloy")


@pytest.mark.parametrize("speaker,voice,used", [
    (ToneSpeaker, "alloy", "af_heart"), (AlloySpeaker, "alloy", "af_alloy"),
    (ToneSpeaker, "Nova", "af_heart"), (AlloySpeaker, "echo,am_adam", "af_heart,am_adam"),
    (AlloySpeaker, "af_alloy", "af_alloy")])
def test_openai_voice_names_stand_for_the_models_voices(speaker, voice, used):
    """OpenAI's voice names (its SDK requires one): the model's voice of that name, else
    its default voice."""
    speaker = speaker()
    with audio_app(tts=speaker) as c:
        r = c.post(TTS, json={"input": "hi", "voice": voice})
    assert r.status_code == 200, r.text
    assert speaker.seen[0].voice == used


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "voice": "nobody"}, "voice"), ({"input": "x" * 4097}, "input"),
    ({"input": " "}, "input"), ({"input": "hi", "speed": 9}, "speed"),
    ({"input": "hi", "response_format": "ogg"}, "response_format")])
def test_bad_speech_requests_are_400(body, param):
    with audio_app(tts=ToneSpeaker()) as c:
        r = c.post(TTS, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    if param == "voice":
        assert "af_heart, am_adam" in r.json()["error"]["message"]


def test_the_first_audio_is_sent_before_synthesis_ends():
    """Driven at the ASGI level (the test client buffers a streamed body): the first body
    message goes out while the model still waits to make the second sentence."""
    gate = threading.Event()
    speaker = ToneSpeaker(gate)
    bodies: list[tuple[int, bool]] = []
    payload = json.dumps({"input": "one. two", "response_format": "pcm"}).encode()

    async def drive(app: Any) -> None:
        scope = {"type": "http", "method": "POST", "path": TTS, "raw_path": TTS.encode(),
                 "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                                  (b"host", b"127.0.0.1")],
                 "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
                 "client": ("127.0.0.1", 1), "root_path": "", "state": {}}
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await __import__("asyncio").sleep(30)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                bodies.append((len(message["body"]), speaker.done.is_set()))
                gate.set()

        await app(scope, receive, send)

    with audio_app(tts=speaker) as c:
        c.blocking_portal.call(drive, c.app)
    assert bodies[0] == (2 * int(0.1 * 24000), False)  # before the model was done
    assert sum(n for n, _ in bodies) == 2 * 2 * int(0.1 * 24000)


def test_sse_speech_and_a_round_trip_to_transcription():
    with audio_app(ToneTranscriber(), ToneSpeaker()) as c:
        sse = c.post(TTS, json={"input": "a b c. d e f g h i j", "stream_format": "sse"})
        spoken = c.post(TTS, json={"input": "a b c d e f g h i j"})
        heard = upload(c, data=spoken.content)
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data:")]
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio.startswith(b"RIFF") and len(audio) > 24000
    assert heard.status_code == 200 and heard.json()["text"] == "tone"
