"""Text to phonemes: sentence splitting, Kokoro's 510-phoneme pieces, espeak-ng for the
languages it serves, and English's choice: misaki's G2P when spaCy's en_core_web_sm is
installed (with spaCy's downloader blocked), else espeak-ng with one startup warning."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
from mlxcel_family_kokoro import g2p
from structlog.testing import capture_logs


@pytest.fixture
def fresh_english():
    g2p.english_fallback_reason.cache_clear()
    yield
    g2p.english_fallback_reason.cache_clear()


def test_sentences_keep_their_end_marks():
    assert g2p.sentences('Hi there. He said "Hi." Then left!\n\nOk') == \
        ["Hi there.", 'He said "Hi."', "Then left!", "Ok"]
    assert g2p.sentences("Wait... what?  3.5 apples") == ["Wait...", "what?", "3.5 apples"]
    assert g2p.sentences("你好。谢谢") == ["你好。", "谢谢"]


def test_long_phonemes_are_cut_at_the_last_pause_that_fits():
    ps = ("ab, " * 100 + "cd. " + "ef " * 100).strip()
    pieces = g2p.split_phonemes(ps, limit=510)
    assert all(len(p) <= 510 for p in pieces) and len(pieces) == 2
    assert pieces[0].endswith("cd.")  # a sentence end wins over the later commas
    assert g2p.split_phonemes("x" * 1100) == ["x" * 510, "x" * 510, "x" * 80]
    assert g2p.split_phonemes("  ") == []


def test_espeak_languages_and_voice_prefixes(monkeypatch):
    assert g2p.language_of("ff_siwis") == "f" and g2p.language_of("custom") == "a"
    french = g2p.Phonemizer(["f"])
    assert list(french.chunks("Bonjour. Merci!", "f")) == ["bɔ̃ʒˈuʁ.", "mɛʁsˈi!"]
    monkeypatch.setitem(g2p.EXTRAS, "j", ("no_such_misaki_ja", "JAG2P", "misaki[ja]"))
    assert g2p.Phonemizer(["j"]).unavailable["j"].startswith("Japanese needs misaki[ja]")


def test_english_without_spacy_s_model_is_espeak_with_one_warning(fresh_english, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == g2p.SPACY_MODEL else real(name, *a))
    with capture_logs() as logs:
        english = g2p.Phonemizer(["a", "b"])
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["kokoro_english_g2p_fallback"]
    assert "en_core_web_sm not installed" in warnings[0]["reason"]
    assert list(english.chunks("Hello world.", "a")) == ["həlˈO wˈɜɹld."]
    assert list(english.chunks("Hello world.", "b")) == ["həlˈQ wˈɜːld."]


def _fake_spacy(monkeypatch, misaki_g2p):
    """spaCy and en_core_web_sm 'installed', misaki.en's G2P replaced by ``misaki_g2p``."""
    downloads = []
    spacy = types.ModuleType("spacy")
    spacy.cli = types.ModuleType("spacy.cli")
    spacy.cli.download = lambda name: downloads.append(name)
    en = types.ModuleType("misaki.en")
    en.G2P = lambda **kw: misaki_g2p(spacy, kw)
    for name, module in {"spacy": spacy, "spacy.cli": spacy.cli, "misaki.en": en}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys.modules["misaki"], "en", en, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object()
                        if name in ("spacy", g2p.SPACY_MODEL) else real(name, *a))
    return downloads


def test_english_with_spacy_s_model_is_misaki_s_g2p(fresh_english, monkeypatch):
    def started(spacy, kw):
        assert kw["trf"] is False and kw["unk"] == "" and kw["fallback"] is not None
        return lambda text: ("mˈIsAki ɾ", [])

    _fake_spacy(monkeypatch, started)
    with capture_logs() as logs:
        english = g2p.Phonemizer(["a"])
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert list(english.chunks("Hi.", "a")) == ["mˈIsAki T"]


def test_misaki_never_downloads_spacy_s_model(fresh_english, monkeypatch):
    def downloading(spacy, kw):  # what misaki.en does when the model is missing
        spacy.cli.download(g2p.SPACY_MODEL)
        return lambda text: ("never", [])

    downloads = _fake_spacy(monkeypatch, downloading)
    with capture_logs() as logs:
        english = g2p.Phonemizer(["a"])
    assert downloads == []
    assert [e["event"] for e in logs] == ["kokoro_english_g2p_fallback"]
    assert list(english.chunks("Hello.", "a")) == ["həlˈO."]
