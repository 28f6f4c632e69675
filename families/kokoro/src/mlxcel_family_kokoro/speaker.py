"""The ``speak`` runner (``mlxcel.families.speech.Speaker``): Kokoro on the engine thread,
a sentence of audio at a time.

Each item's text is phonemized a sentence at a time (``g2p.Phonemizer``) and each
sentence's audio is handed to ``emit`` as soon as it is made, so a streamed response
starts after the first sentence rather than after the whole text. The items of a batch
take turns, a sentence each, so no request waits for another's whole text before its
first audio.

A voice is a pack of styles, one per phoneme count (``[510, 1, 256]``); a sentence of
``n`` phonemes is spoken with row ``n - 1``, as Kokoro's pipeline does. ``"a,b"`` speaks
with the average of the named packs, as Kokoro's users mix voices. Every voice of a batch
is checked before anything is synthesized: an unknown one is an ``InvalidRequest`` on
``voice`` that lists the voices there are, never a download.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlxcel.errors import InvalidRequest
from mlxcel.families.api import Loaded
from mlxcel.families.speech import Emit, Utterance
from mlxcel.families.tasks import TaskOptions

from mlxcel_family_kokoro import g2p
from mlxcel_family_kokoro.load import KokoroCheckpoint

DEFAULT_VOICE = "af_heart"
MAX_MIX = 2  # voices one request may mix: "a,b", as the route allows


class KokoroSpeaker:
    """Kokoro's ``speak`` runner. ``voices``: the checkpoint's packs whose language this
    server can phonemize; ``unavailable``: the other packs, each with why."""

    def __init__(self, checkpoint: KokoroCheckpoint) -> None:
        self.module = checkpoint.module
        self.sample_rate = int(checkpoint.sample_rate)
        self._files = dict(checkpoint.voices)
        if not self._files:
            raise ValueError(f"{checkpoint.path}: no voice packs in voices/")
        self.phonemizer = g2p.Phonemizer(g2p.language_of(v) for v in self._files)
        skipped = self.phonemizer.unavailable
        self.unavailable = {v: skipped[g2p.language_of(v)] for v in self._files
                            if g2p.language_of(v) in skipped}
        self.voices = tuple(v for v in self._files if v not in self.unavailable)
        if not self.voices:
            raise ValueError(f"{checkpoint.path}: no voice this server can phonemize "
                             f"({'; '.join(sorted(set(skipped.values())))})")
        self.default_voice = DEFAULT_VOICE if DEFAULT_VOICE in self.voices else self.voices[0]
        self._packs: dict[str, mx.array] = {}

    def resolve_voice(self, voice: str) -> tuple[str, ...]:
        """The pack names of ``voice`` (one, or several joined by commas); the default
        voice for an empty one. ``InvalidRequest`` on ``voice`` naming the problem and
        the voices there are. Pure Python: callable on the HTTP side too."""
        names = tuple(n.strip() for n in (voice or self.default_voice).split(","))
        if len(names) > MAX_MIX or not all(names):
            raise InvalidRequest(f"voice {voice!r}: give one voice, or two joined by a "
                                 "comma to mix them", param="voice")
        for name in names:
            if name in self.unavailable:
                raise InvalidRequest(f"voice {name!r} is not available on this server: "
                                     f"{self.unavailable[name]}", param="voice")
            if name not in self._files:
                raise InvalidRequest(f"unknown voice {name!r}; available voices: "
                                     f"{', '.join(self.voices)}", param="voice")
        return names

    def pack(self, voice: str) -> mx.array:
        """The style pack of ``voice`` (the mean of a mix's packs), read once."""
        names = self.resolve_voice(voice)
        key = ",".join(names)
        if key not in self._packs:
            packs = [self._read(n) for n in names]
            self._packs[key] = packs[0] if len(packs) == 1 else mx.mean(mx.stack(packs), axis=0)
        return self._packs[key]

    def _read(self, name: str) -> mx.array:
        if name not in self._packs:
            weights = mx.load(str(self._files[name]))
            if "voice" not in weights:
                raise ValueError(f"{self._files[name]}: no 'voice' tensor in the pack")
            self._packs[name] = weights["voice"].astype(mx.float32)
        return self._packs[name]

    def _audio(self, item: Utterance, names: tuple[str, ...]) -> Iterator[np.ndarray]:
        """Item's audio, a sentence's chunk at a time, each made when it is asked for."""
        pack = self.pack(",".join(names))
        for ps in self.phonemizer.chunks(item.text, g2p.language_of(names[0])):
            style = pack[min(len(ps), pack.shape[0]) - 1]
            audio = self.module(ps, style, item.speed)
            mx.eval(audio)
            yield np.asarray(audio, dtype=np.float32).reshape(-1)

    def speak(self, items: Sequence[Utterance], emit: Emit) -> list[int]:
        """Each item's audio ``emit``-ted a sentence at a time, the items taking turns;
        each item's sample count. Engine thread."""
        for item in items:
            if not (isinstance(item.speed, int | float) and math.isfinite(item.speed)
                    and item.speed > 0):
                raise InvalidRequest(f"speed must be a positive number, not {item.speed!r}",
                                     param="speed")
        streams = {i: self._audio(item, self.resolve_voice(item.voice))
                   for i, item in enumerate(items)}
        counts = [0] * len(items)
        while streams:
            for i, stream in list(streams.items()):
                chunk = next(stream, None)
                if chunk is None:
                    del streams[i]
                elif chunk.size:
                    counts[i] += int(chunk.size)
                    emit(i, chunk)
        return counts


def make(loaded: Loaded, options: TaskOptions | Any = None) -> KokoroSpeaker:
    """The ``speak`` task's factory: called once on the engine thread after ``load``."""
    return KokoroSpeaker(loaded.model)
