"""Speech end to end (issue #31): the real ``mlxcel-server`` driven by the real ``openai``
and ``anthropic`` SDKs, on random-weight checkpoints built offline (the tiny Whisper of
``mlxcel.testing.whisper_checkpoints``, multilingual so that language detection runs, and
the tiny Kokoro of ``mlxcel.testing.kokoro_checkpoints``). Random weights say nothing
sensible, so the tests check shapes, times and durations, never words.

* A voice agent: the tiny chat checkpoint with ``--stt-model`` and ``--tts-model``.
  Transcription in every ``response_format`` (``verbose_json`` with word and segment
  timestamps), streamed (``transcript.text.delta`` then ``transcript.text.done``, read
  through the SDK's stream), translation; speech as WAV at 24 kHz, as PCM streamed through
  ``with_streaming_response``, as MP3 and FLAC through ffmpeg (decoded back by ffmpeg and
  read back by the transcription route); an unknown voice; a WAV the speech route wrote,
  sent back to the transcription route, with the duration it has; the upload limits
  (over 25 MiB with and without a Content-Length, just under it, a corrupt WAV).
* An audio-only process (``-m`` Whisper, ``--audio-queue-depth 1``): chat, completions and
  messages answer 501 in their SDK's shape naming the routes served, ``/v1/models`` lists
  the transcription model, and a flood of concurrent requests gets 200s and 503s, never
  a 500, and the server keeps serving.

Kokoro on 2 cores is slow, so each synthesis is a few words.
"""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import threading
import wave
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import numpy as np
import openai
import pytest
from mlxcel.testing.servers import MlxcelServer
from openai.types.audio import (
    Transcription,
    TranscriptionVerbose,
    Translation,
    TranslationVerbose,
)

pytestmark = pytest.mark.slow

API_KEY = "k-audio"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
STT, STT_ROUTES = "/v1/audio/transcriptions", ("/v1/audio/transcriptions",
                                               "/v1/audio/translations")
KOKORO_RATE = 24000
CLIP_SECONDS = 2.0
SAY = "Hi there."
MAX_UPLOAD = 25 << 20
ENV = {"HF_HUB_OFFLINE": "1"}


# --- audio --------------------------------------------------------------------------------


def wav_bytes(seconds: float, rate: int, channels: int = 1) -> bytes:
    """A 16-bit WAV: a 440 Hz tone for the first second, then quiet."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.5 * np.sin(2 * np.pi * 440 * t) * (t < 1.0) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(pcm[:, None], channels, axis=1).tobytes())
    return out.getvalue()


def read_wav(data: bytes) -> tuple[int, int, int, int]:
    """(rate, channels, sample width, frames) of ``data``. The frames are counted from
    the samples there are: a streamed WAV leaves its RIFF sizes open (0xFFFFFFFF), as
    OpenAI's does, so the header's count is not the length."""
    with wave.open(io.BytesIO(data)) as w:
        raw = w.readframes(w.getnframes())
        return (w.getframerate(), w.getnchannels(), w.getsampwidth(),
                len(raw) // (w.getsampwidth() * w.getnchannels()))


def ffprobe(data: bytes) -> dict:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_streams", "-of", "json",
                          "-i", "pipe:0"], input=data, capture_output=True, check=True)
    return json.loads(out.stdout)["streams"][0]


def ffmpeg_samples(data: bytes) -> int:
    """How many 16-bit mono samples at 24 kHz ffmpeg decodes from ``data``."""
    out = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-i", "pipe:0", "-f", "s16le",
                          "-ac", "1", "-ar", str(KOKORO_RATE), "pipe:1"], input=data,
                         capture_output=True, check=True)
    return len(out.stdout) // 2


def no_space(text: str) -> str:
    return "".join(text.split())


CUE = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d{3}) --> (\d\d):(\d\d):(\d\d)[,.](\d{3})")


def cues(body: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each SRT or WebVTT cue."""
    out = []
    for block in body.strip("\n").split("\n\n"):
        lines = block.split("\n")
        at = next(i for i, line in enumerate(lines) if CUE.fullmatch(line))
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, CUE.fullmatch(lines[at]).groups())
        out.append((h1 * 3600 + m1 * 60 + s1 + ms1 / 1000,
                    h2 * 3600 + m2 * 60 + s2 + ms2 / 1000, "\n".join(lines[at + 1:])))
    return out


def check_segments(segments, duration: float) -> None:
    """Numbered from 0, each inside the audio, start before end."""
    assert [s.id for s in segments] == list(range(len(segments)))
    for s in segments:
        assert 0.0 <= s.start <= s.end <= duration, s
        assert isinstance(s.text, str) and all(isinstance(t, int) for t in s.tokens)
        assert math.isfinite(s.avg_logprob) and 0.0 <= s.no_speech_prob <= 1.0


# --- servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def speech_models(mlxcel_checkpoint_cache):
    """(whisper, kokoro): the tiny checkpoints, built once in the checkpoint cache."""
    from mlxcel.testing.kokoro_checkpoints import cached_kokoro_checkpoint
    from mlxcel.testing.whisper_checkpoints import cached_whisper_checkpoint

    return (cached_whisper_checkpoint("hf", True, cache_dir=mlxcel_checkpoint_cache),
            cached_kokoro_checkpoint(cache_dir=mlxcel_checkpoint_cache))


@pytest.fixture(scope="module")
def agent(tiny_checkpoint, speech_models):
    """A voice agent's process: a chat model, Whisper and Kokoro."""
    whisper, kokoro = speech_models
    srv = MlxcelServer(["--model", str(tiny_checkpoint), "--stt-model", str(whisper),
                        "--tts-model", str(kokoro), "--api-key", API_KEY], env=ENV)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oai(agent):
    return openai.OpenAI(base_url=agent.base_url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def web(agent):
    with httpx.Client(base_url=agent.base_url, headers=HEADERS, timeout=60,
                      trust_env=False) as c:
        yield c


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """Two seconds at 44.1 kHz (resampled to Whisper's 16 kHz by the server)."""
    path = tmp_path_factory.mktemp("audio") / "clip.wav"
    path.write_bytes(wav_bytes(CLIP_SECONDS, 44100))
    return path


@pytest.fixture(scope="module")
def plain(oai, clip):
    """The clip's transcription in the default format (json)."""
    with open(clip, "rb") as f:
        return oai.audio.transcriptions.create(model="whisper", file=f)


@pytest.fixture(scope="module")
def spoken(oai):
    """WAV bytes the speech route wrote for ``SAY`` (the default format)."""
    speech = oai.audio.speech.create(model="kokoro", voice="af_heart", input=SAY)
    assert speech.response.headers["content-type"] == "audio/wav"
    return speech.content


@pytest.fixture(scope="module")
def audio_only(speech_models):
    """``-m`` Whisper alone, with a queue of one."""
    srv = MlxcelServer(["-m", str(speech_models[0]), "--audio-queue-depth", "1",
                        "--api-key", API_KEY], env=ENV)
    yield srv
    srv.stop()


# --- transcription ------------------------------------------------------------------------


def test_transcription_json_and_text(oai, clip, plain):
    assert isinstance(plain, Transcription)
    assert isinstance(plain.text, str) and plain.text == plain.text.strip()
    assert (plain.usage.type, plain.usage.seconds) == ("duration", math.ceil(CLIP_SECONDS))
    with open(clip, "rb") as f:
        text = oai.audio.transcriptions.create(model="whisper", file=f, response_format="text")
    assert isinstance(text, str) and text == plain.text + "\n"


def test_transcription_verbose_json_with_words_and_segments(oai, clip):
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    with open(clip, "rb") as f:
        r = oai.audio.transcriptions.create(model="whisper", file=f,
                                            response_format="verbose_json",
                                            timestamp_granularities=["word", "segment"])
    assert isinstance(r, TranscriptionVerbose)
    assert r.duration == CLIP_SECONDS and r.language in LANGUAGES.values()
    assert r.model_extra.get("task") == "transcribe"
    assert r.segments and r.words
    check_segments(r.segments, r.duration)
    assert "".join(s.text for s in r.segments).strip() == r.text
    for w in r.words:
        assert isinstance(w.word, str) and 0.0 <= w.start <= w.end <= r.duration, w
    assert [w.start for w in r.words] == sorted(w.start for w in r.words)


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_transcription_subtitles(oai, clip, plain, fmt):
    """Numbered SRT cues / a WebVTT header, then cues inside the clip, in order, that
    hold the same text as the json transcription (the decode is seeded by the audio)."""
    with open(clip, "rb") as f:
        body = oai.audio.transcriptions.create(model="whisper", file=f, response_format=fmt)
    assert isinstance(body, str)
    if fmt == "vtt":
        assert body.startswith("WEBVTT\n\n")
        body = body[len("WEBVTT\n\n"):]
    else:
        numbers = [b.split("\n")[0] for b in body.strip("\n").split("\n\n")]
        assert numbers == [str(i) for i in range(1, len(numbers) + 1)]
    found = cues(body)
    assert found
    for start, end, _ in found:
        assert 0.0 <= start <= end <= CLIP_SECONDS
    assert [c[0] for c in found] == sorted(c[0] for c in found)
    assert no_space("".join(c[2] for c in found)) == no_space(plain.text)


def test_streamed_transcription_through_the_sdk(oai, clip, plain):
    with open(clip, "rb") as f:
        events = list(oai.audio.transcriptions.create(model="whisper", file=f, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    assert len(kinds) > 1 and set(kinds[:-1]) == {"transcript.text.delta"}
    done = events[-1]
    assert "".join(e.delta for e in events[:-1]).strip() == done.text == plain.text
    assert (done.usage.type, done.usage.seconds) == ("duration", math.ceil(CLIP_SECONDS))


def test_translation(oai, clip):
    with open(clip, "rb") as f:
        plain = oai.audio.translations.create(model="whisper", file=f)
    with open(clip, "rb") as f:
        verbose = oai.audio.translations.create(model="whisper", file=f,
                                                response_format="verbose_json")
    with open(clip, "rb") as f:
        srt = oai.audio.translations.create(model="whisper", file=f, response_format="srt")
    assert isinstance(plain, Translation) and isinstance(plain.text, str)
    assert isinstance(verbose, TranslationVerbose)
    assert verbose.model_extra.get("task") == "translate" and verbose.duration == CLIP_SECONDS
    assert verbose.text == plain.text and verbose.segments
    check_segments(verbose.segments, verbose.duration)
    assert no_space("".join(c[2] for c in cues(srt))) == no_space(plain.text)


def test_translation_verbose_json_names_english(oai, clip):
    """OpenAI's ``TranslationVerbose.language`` is the output's language, "always
    english"; a transcription's is the one detected."""
    with open(clip, "rb") as f:
        verbose = oai.audio.translations.create(model="whisper", file=f,
                                                response_format="verbose_json")
    assert verbose.language == "english"


# --- speech -------------------------------------------------------------------------------


def test_speech_is_a_wav_at_24_khz(spoken):
    rate, channels, width, frames = read_wav(spoken)
    assert (rate, channels, width) == (KOKORO_RATE, 1, 2) and frames > 0
    assert len(spoken) == 44 + 2 * frames


def test_speech_streamed_as_pcm(oai):
    with oai.audio.speech.with_streaming_response.create(
            model="kokoro", voice="af_heart", input=SAY, response_format="pcm") as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        parts = [p for p in r.iter_bytes() if p]
    assert parts and all(isinstance(p, bytes) for p in parts)
    total = sum(len(p) for p in parts)
    assert total > 0 and total % 2 == 0  # 16-bit samples


def test_an_openai_voice_name_speaks_with_the_default_voice(oai):
    """The SDK requires a voice and its examples say ``alloy``: the checkpoint has no
    ``*_alloy`` pack, so its default voice speaks: as many samples as asking for it (the
    voice sets the durations; the vocoder's noise differs per call)."""
    asked = oai.audio.speech.create(model="tts-1", voice="alloy", input=SAY,
                                    response_format="pcm").content
    default = oai.audio.speech.create(model="tts-1", voice="af_heart", input=SAY,
                                      response_format="pcm").content
    assert len(asked) > 0 and len(asked) == len(default)


def test_an_unknown_voice_is_a_400_listing_the_voices(oai):
    from mlxcel.testing.kokoro_checkpoints import VOICES

    with pytest.raises(openai.BadRequestError) as err:
        oai.audio.speech.create(model="kokoro", voice="zz_nobody", input=SAY)
    assert err.value.status_code == 400 and err.value.body["param"] == "voice"
    assert all(v in err.value.message for v in VOICES)


@pytest.mark.parametrize("fmt,codec,media", [("mp3", "mp3", "audio/mpeg"),
                                             ("flac", "flac", "audio/flac")])
def test_speech_through_ffmpeg_decodes_back(oai, web, spoken, fmt, codec, media):
    """The bytes are ``fmt`` at 24 kHz mono (ffprobe), ffmpeg decodes them, and the
    transcription route reads them. FLAC is lossless: as many samples as the WAV of the
    same text (Kokoro's durations are the model's, its noise is not); MP3 pads."""
    speech = oai.audio.speech.create(model="kokoro", voice="af_heart", input=SAY,
                                     response_format=fmt)
    assert speech.response.headers["content-type"] == media
    stream = ffprobe(speech.content)
    assert (stream["codec_name"], int(stream["sample_rate"]), stream["channels"]) == \
        (codec, KOKORO_RATE, 1)
    samples, wav_frames = ffmpeg_samples(speech.content), read_wav(spoken)[3]
    assert samples == wav_frames if fmt == "flac" else samples >= wav_frames
    heard = web.post(STT, files={"file": (f"speech.{fmt}", speech.content, media)},
                     data={"response_format": "verbose_json"})
    assert heard.status_code == 200, heard.text
    assert heard.json()["duration"] == pytest.approx(samples / KOKORO_RATE, abs=0.01)


def test_a_wav_from_speech_round_trips_to_transcription(oai, spoken):
    frames = read_wav(spoken)[3]
    seconds = frames / KOKORO_RATE
    verbose = oai.audio.transcriptions.create(
        model="whisper", file=("speech.wav", spoken, "audio/wav"),
        response_format="verbose_json")
    assert verbose.duration == pytest.approx(seconds, abs=0.01)
    check_segments(verbose.segments or [], verbose.duration)
    assert verbose.usage.seconds == math.ceil(seconds)


def test_the_chat_model_serves_beside_the_speech_models(oai, web):
    chat = oai.chat.completions.create(model="chat", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content is not None
    caps = sorted(m["capabilities"][0] for m in web.get("/v1/models").json()["data"])
    assert caps == ["completion", "speech", "transcription"]


# --- limits -------------------------------------------------------------------------------


def test_an_upload_over_25_mib_is_413(oai, web):
    big = b"RIFF" + b"\0" * (26 << 20)
    with pytest.raises(openai.APIStatusError) as err:
        oai.audio.transcriptions.create(model="whisper", file=("big.wav", big, "audio/wav"))
    assert err.value.status_code == 413 and err.value.body["param"] == "file"
    assert "25 MiB" in err.value.message

    boundary = "audio-e2e-boundary"

    def chunked():  # no Content-Length: the bound holds on the body as it is read
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
               f'filename="big.wav"\r\nContent-Type: audio/wav\r\n\r\n').encode()
        for _ in range(26):
            yield b"\0" * (1 << 20)
        yield f"\r\n--{boundary}--\r\n".encode()

    r = web.post(STT, content=chunked(),
                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413, r.text
    assert web.get("/health").status_code == 200


def test_an_upload_just_under_25_mib_is_served(web):
    """8 s at 192 kHz in 8 channels (the decoders' upper bounds): about 23.4 MiB,
    decoded, mixed down and resampled; billed as 8 whole seconds."""
    data = wav_bytes(8.0, 192000, channels=8)
    assert MAX_UPLOAD - (2 << 20) < len(data) < MAX_UPLOAD
    r = web.post(STT, files={"file": ("big.wav", data, "audio/wav")},
                 data={"response_format": "verbose_json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["duration"] == 8.0
    assert body["usage"] == {"type": "duration", "seconds": 8}


def test_a_corrupt_wav_is_400_naming_the_format(oai):
    corrupt = b"RIFF\0\0\0\0WAVE" + b"\x01" * 64
    with pytest.raises(openai.BadRequestError) as err:
        oai.audio.transcriptions.create(model="whisper",
                                        file=("clip.wav", corrupt, "audio/wav"))
    assert err.value.body["param"] == "file" and "wav" in err.value.message.lower()


# --- an audio-only process ----------------------------------------------------------------


def test_audio_only_chat_routes_are_501_in_each_dialect(audio_only):
    sdk = openai.OpenAI(base_url=audio_only.base_url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as chat:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APIStatusError) as completion:
        sdk.completions.create(model="m", prompt="hi", max_tokens=4)
    for err in (chat, completion):
        assert err.value.status_code == 501
        assert all(route in err.value.message for route in STT_ROUTES)
    claude = anthropic.Anthropic(base_url=audio_only.base_url, api_key=API_KEY,
                                 max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as msg:
        claude.messages.create(model="m", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert msg.value.status_code == 501
    assert msg.value.body["type"] == "error" and msg.value.body["error"]["type"]
    assert all(route in msg.value.body["error"]["message"] for route in STT_ROUTES)
    with httpx.Client(base_url=audio_only.base_url, headers=HEADERS, timeout=30,
                      trust_env=False) as c:
        raw = c.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "hi"}]})
        raw_msg = c.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"}]})
    assert set(raw.json()) == {"error"} and {"message", "type"} <= set(raw.json()["error"])
    assert set(raw_msg.json()) == {"type", "error"}


def test_audio_only_lists_the_transcription_model(audio_only, speech_models):
    with httpx.Client(base_url=audio_only.base_url, headers=HEADERS, timeout=30,
                      trust_env=False) as c:
        models = c.get("/v1/models").json()["data"]
        speech = c.post("/v1/audio/speech", json={"input": SAY})
    assert [(m["id"], m["capabilities"]) for m in models] == \
        [(speech_models[0].name, ["transcription"])]
    assert speech.status_code == 501 and "--tts-model" in speech.json()["error"]["message"]


def test_a_flooded_queue_of_one_gives_503s_never_500s(audio_only):
    """Eight requests at once (plain, streamed, translations) on a queue of one: each
    is a 200 or a 503 in OpenAI's shape, some of each; the server serves afterwards."""
    data = wav_bytes(CLIP_SECONDS, 16000)
    go = threading.Barrier(8)

    def one(i: int) -> tuple[int, str]:
        path = "/v1/audio/translations" if i % 4 == 3 else STT
        fields = {"stream": "true"} if i % 4 == 1 and path == STT else {}
        with httpx.Client(base_url=audio_only.base_url, headers=HEADERS, timeout=60,
                          trust_env=False) as c:
            go.wait(10)
            r = c.post(path, files={"file": ("clip.wav", data, "audio/wav")}, data=fields)
            return r.status_code, r.text

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    codes = sorted(code for code, _ in results)
    assert set(codes) <= {200, 503}, results
    assert 200 in codes and 503 in codes, codes
    for code, text in results:
        if code == 503:
            assert json.loads(text)["error"]["message"]
        elif "transcript.text" in text:  # a streamed one that was admitted
            assert "transcript.text.done" in text and '"error"' not in text
    with httpx.Client(base_url=audio_only.base_url, headers=HEADERS, timeout=60,
                      trust_env=False) as c:
        after = c.post(STT, files={"file": ("clip.wav", data, "audio/wav")})
        health = c.get("/health")
    assert after.status_code == 200 and isinstance(after.json()["text"], str)
    assert health.status_code == 200
