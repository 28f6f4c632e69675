"""Deterministic byte-level BPE tokenizer for tiny test checkpoints.

Heavy libraries (``tokenizers``) are imported inside functions so that importing
this module stays cheap.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from .templates import DEFAULT, style, template_text

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BEGIN_OF_TEXT = "<|begin_of_text|>"
BYTE_ALPHABET_SIZE = 256


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids of a built tokenizer that configs refer to."""

    eos_ids: list[int]  # generation_config.json's eos_token_id; [0] is config.json's
    bos: int | None  # None when the style has no BOS (qwen3-shape chatml)
    pad: int | None

    @property
    def config_bos(self) -> int:
        """config.json's ``bos_token_id``: the BOS, else the pad token (Qwen's way)."""
        return self.bos if self.bos is not None else self.pad  # type: ignore[return-value]


def _bos(shape: str, template: str) -> str | None:
    """A chatml tokenizer of a llama-shape checkpoint has Llama's BOS, as it always had."""
    if template == DEFAULT and shape == "llama":
        return BEGIN_OF_TEXT
    return style(template).bos


def added_tokens(shape: str, template: str = DEFAULT) -> list[tuple[str, bool]]:
    """Added tokens as ``(content, special)``, in id order."""
    st = style(template)
    special = list(st.special)
    bos = _bos(shape, template)
    if bos is not None and bos not in special:
        special.append(bos)
    return [(t, True) for t in special] + [(t, False) for t in st.plain]


def corpus_text() -> str:
    """The bundled training corpus."""
    return resources.files(__package__).joinpath("corpus.txt").read_text("utf-8")


def chat_template_text(template: str = DEFAULT) -> str:
    """The bundled chat template of style ``template`` (default: ChatML)."""
    return template_text(template)


def _train_bpe(vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer=trainer)
    return tok


def _add_tokens(tok: Tokenizer, tokens: list[tuple[str, bool]]) -> None:
    from tokenizers import AddedToken

    for special, group in itertools.groupby(tokens, key=lambda t: t[1]):
        added = [AddedToken(c, special=special, normalized=False) for c, _ in group]
        if special:
            tok.add_special_tokens(added)
        else:
            tok.add_tokens(added)


def _post_processor(bos: str | None, bos_id: int | None) -> Any:
    from tokenizers import processors

    byte_level = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if bos is None:
        return byte_level
    template = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0",
        pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, bos_id)],
    )
    return processors.Sequence([byte_level, template])


def _adds_bos(shape: str, template: str) -> bool:
    return template == DEFAULT and shape == "llama" or style(template).add_bos


def build_tokenizer(shape: str = "qwen3", vocab_size: int = 512,
                    template: str = DEFAULT, extra_special: tuple[str, ...] = ()) -> Tokenizer:
    """Train a byte-level BPE whose total size (added tokens included) is ``vocab_size``,
    with the added tokens of style ``template`` (``mlxcel.testing.templates``), then the
    special tokens ``extra_special`` (e.g. fill-in-the-middle markers).

    If the corpus cannot supply enough merges, ``<|reserved_N|>`` special tokens pad
    the vocabulary up to the requested size.
    """
    named = added_tokens(shape, template) + [(t, True) for t in extra_special]
    base_size = vocab_size - len(named)
    if base_size < BYTE_ALPHABET_SIZE:
        raise ValueError(f"vocab_size must be at least {BYTE_ALPHABET_SIZE + len(named)}")
    tok = _train_bpe(base_size)
    _add_tokens(tok, named)
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    _add_tokens(tok, [(f"<|reserved_{i}|>", True) for i in range(missing)])
    bos = _bos(shape, template) if _adds_bos(shape, template) else None
    tok.post_processor = _post_processor(bos, tok.token_to_id(bos) if bos else None)
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:  # pragma: no cover
        raise RuntimeError("tokenizer vocabulary does not match vocab_size")
    return tok


def special_token_ids(tok: Tokenizer, shape: str = "qwen3",
                      template: str = DEFAULT) -> SpecialTokens:
    """Ids of the special tokens of style ``template`` in ``tok``."""
    st = style(template)
    bos, pad = _bos(shape, template), st.pad
    return SpecialTokens(
        eos_ids=[tok.token_to_id(t) for t in st.eos],
        bos=tok.token_to_id(bos) if bos else None,
        pad=tok.token_to_id(pad) if pad else None,
    )


def tokenizer_config(shape: str, tok: Tokenizer, model_max_length: int,
                     template: str = DEFAULT) -> dict[str, Any]:
    """Contents of tokenizer_config.json for transformers' AutoTokenizer."""
    st = style(template)
    decoder = {
        str(tid): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for tid, t in sorted(tok.get_added_tokens_decoder().items())
    }
    return {
        "add_bos_token": _adds_bos(shape, template),
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": _bos(shape, template),
        "chat_template": template_text(template),
        "clean_up_tokenization_spaces": False,
        "eos_token": st.eos[0],
        "errors": "replace",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "pad_token": st.pad,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def special_tokens_map(shape: str, template: str = DEFAULT) -> dict[str, Any]:
    """Contents of special_tokens_map.json: every special added token but BOS and pad is
    an additional special token."""
    st = style(template)
    bos = _bos(shape, template)
    out: dict[str, Any] = {
        "additional_special_tokens": [t for t in st.special if t not in (bos, st.pad)],
        "eos_token": st.eos[0],
    }
    if st.pad is not None:
        out["pad_token"] = st.pad
    if bos is not None:
        out["bos_token"] = bos
    return out
