"""Text to Kokoro's phonemes, sentence by sentence, with misaki and the bundled espeak-ng.

A voice's first letter names its language, as Kokoro's packs do (``af_heart``: American
English, ``bf_emma``: British, ``ff_siwis``: French, ...). English goes through misaki's
G2P (lexicon, heteronyms, numbers), which needs spaCy's ``en_core_web_sm``: that model is
not on the package index and misaki would download it on first use, so it is used only
when it is already installed, with spaCy's downloader blocked while misaki starts; else
English falls back to espeak-ng through misaki's English phoneme mapping, with one warning
at startup. Spanish, French, Hindi, Italian and Portuguese use misaki's espeak-ng G2P;
Japanese and Chinese need misaki's ``ja``/``zh`` extras. espeak-ng itself is the library
and data ``espeakng-loader`` ships, so nothing is fetched, at startup or per request.

Every G2P is built once, at startup (``Phonemizer``), so that a request never starts one.
Text is split into sentences before G2P, so that the first sentence's audio can be made
and sent before the next is even phonemized; a sentence whose phonemes exceed Kokoro's
510 is split again at the last pause that fits, as Kokoro's own pipeline does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import re
from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace

import structlog

log = structlog.get_logger("mlxcel.kokoro")

# voice prefix -> (language, espeak-ng voice or None for misaki's own G2P)
LANGUAGES = {"a": ("American English", "en-us"), "b": ("British English", "en-gb"),
             "e": ("Spanish", "es"), "f": ("French", "fr-fr"), "h": ("Hindi", "hi"),
             "i": ("Italian", "it"), "p": ("Brazilian Portuguese", "pt-br"),
             "j": ("Japanese", None), "z": ("Mandarin Chinese", None)}
EXTRAS = {"j": ("misaki.ja", "JAG2P", "misaki[ja]"), "z": ("misaki.zh", "ZHG2P", "misaki[zh]")}
MAX_PHONEMES = 510  # Kokoro's context: 512 positions less the two pads
SPACY_MODEL = "en_core_web_sm"
PAUSES = ("!.?…", ":;", ",—", " ")  # where a long phoneme string is cut, best first
_SENTENCE = re.compile(r".+?(?:[.!?…]+[\"”’')\]]*(?=\s|$)|[。！？]+|$)", re.S)


def language_of(voice: str) -> str:
    """The language code of a voice (its first letter); American English when unknown,
    as Kokoro's pipeline defaults to."""
    return voice[:1] if voice[:1] in LANGUAGES else "a"


def sentences(text: str) -> list[str]:
    """``text``'s lines split at sentence ends (``.``, ``!``, ``?``, ``…`` before a space,
    ``。！？``), the end marks kept since they shape the prosody."""
    out: list[str] = []
    for line in re.split(r"\n+", text):
        out.extend(s for m in _SENTENCE.finditer(line) if (s := m.group().strip()))
    return out


def split_phonemes(ps: str, limit: int = MAX_PHONEMES) -> list[str]:
    """``ps`` in pieces of at most ``limit``, each cut after the last sentence end that
    fits, else clause mark, else comma, else space (Kokoro's waterfall)."""
    out: list[str] = []
    ps = ps.strip()
    while len(ps) > limit:
        head = ps[:limit]
        cut = next((i + 1 for marks in PAUSES
                    if (i := max(head.rfind(m) for m in marks)) > 0), limit)
        out.append(ps[:cut].strip())
        ps = ps[cut:].strip()
    return out + [ps] if ps else out


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    """spaCy's model downloader refused while misaki starts: its G2P calls it when
    ``en_core_web_sm`` is missing, and this server never fetches anything."""
    import spacy.cli

    saved = spacy.cli.download

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"spaCy tried to download {args[0] if args else 'a model'}")

    spacy.cli.download = refuse
    try:
        yield
    finally:
        spacy.cli.download = saved


@functools.cache
def english_fallback_reason() -> str | None:
    """Why misaki's English G2P cannot run here (None when it can); the first call that
    finds a reason logs the one startup warning."""
    missing = [name for name in ("spacy", SPACY_MODEL) if importlib.util.find_spec(name) is None]
    reason = f"{' and '.join(missing)} not installed" if missing else None
    if reason is None:
        try:
            importlib.import_module("misaki.en")
        except ImportError as exc:
            reason = f"misaki's English G2P does not import ({exc})"
    if reason is not None:
        log.warning("kokoro_english_g2p_fallback", reason=reason,
                    detail="English is phonemized by espeak-ng: heteronyms, numbers and "
                           "names read worse; install mlxcel-family-kokoro[en] and spaCy's "
                           f"{SPACY_MODEL} for misaki's English G2P")
    return reason


def _espeak_english(british: bool) -> Callable[[str], str]:
    from misaki.espeak import EspeakFallback

    fallback = EspeakFallback(british=british)
    return lambda text: fallback(SimpleNamespace(text=text))[0] or ""


def _misaki_english(british: bool) -> Callable[[str], str]:
    from misaki import en
    from misaki.espeak import EspeakFallback

    with _no_downloads():
        g2p = en.G2P(trf=False, british=british, fallback=EspeakFallback(british=british),
                     unk="")
    return lambda text: g2p(text)[0] or ""


def build(code: str) -> Callable[[str], str]:
    """The G2P of language ``code``: text -> phoneme string. ``ImportError`` when what it
    needs is not installed."""
    name, espeak_voice = LANGUAGES[code]
    if code in "ab":
        british, english = code == "b", None
        if english_fallback_reason() is None:
            try:
                english = _misaki_english(british)
            except Exception as exc:  # noqa: BLE001 - any failure falls back, with its reason
                log.warning("kokoro_english_g2p_fallback", detail="English is phonemized by "
                            "espeak-ng", reason=f"misaki's English G2P did not start ({exc})")
        english = english or _espeak_english(british)
        return lambda text: english(text).replace("ɾ", "T")  # Kokoro's flap, as its pipeline
    if code in EXTRAS:
        module, cls, extra = EXTRAS[code]
        try:
            g2p = getattr(importlib.import_module(module), cls)()
        except ImportError as exc:
            raise ImportError(f"{name} needs {extra} ({exc})") from None
        return lambda text: (lambda r: r[0] if isinstance(r, tuple) else r)(g2p(text)) or ""
    from misaki.espeak import EspeakG2P

    g2p = EspeakG2P(language=espeak_voice)
    return lambda text: g2p(text)[0] or ""


class Phonemizer:
    """One G2P per language of the checkpoint's voices, built at startup. ``unavailable``:
    language code -> why its G2P could not be built (a missing extra)."""

    def __init__(self, codes: Iterable[str]) -> None:
        self._g2p: dict[str, Callable[[str], str]] = {}
        self.unavailable: dict[str, str] = {}
        for code in sorted(set(codes)):
            try:
                self._g2p[code] = build(code)
            except (ImportError, OSError, RuntimeError) as exc:
                self.unavailable[code] = str(exc)
                log.warning("kokoro_language_unavailable", language=LANGUAGES[code][0],
                            reason=str(exc))

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self._g2p)

    def chunks(self, text: str, code: str) -> Iterator[str]:
        """``text``'s phonemes, a sentence (or a 510-phoneme piece of one) at a time,
        each phonemized only when the previous one has been consumed."""
        g2p = self._g2p[code]
        for sentence in sentences(text):
            yield from split_phonemes(g2p(sentence))
