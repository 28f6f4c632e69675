"""Deterministic byte-level BPE tokenizer for tiny test checkpoints.

Heavy libraries (``tokenizers``) are imported inside functions so that importing
this module stays cheap.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BEGIN_OF_TEXT = "<|begin_of_text|>"
THINK_TOKENS = ("<think>", "</think>")
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")
BYTE_ALPHABET_SIZE = 256


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids of a built tokenizer that configs refer to."""

    endoftext: int
    im_start: int
    im_end: int
    bos: int | None  # <|begin_of_text|> for llama, None for qwen3

    @property
    def eos_ids(self) -> list[int]:
        """EOS ids for generation_config.json: ``[<|im_end|>, <|endoftext|>]``."""
        return [self.im_end, self.endoftext]


def added_tokens(shape: str) -> list[tuple[str, bool]]:
    """Added tokens as ``(content, special)``, in id order."""
    tokens = [(ENDOFTEXT, True), (IM_START, True), (IM_END, True)]
    if shape == "llama":
        tokens.append((BEGIN_OF_TEXT, True))
    tokens += [(t, False) for t in THINK_TOKENS + TOOL_CALL_TOKENS]
    return tokens


def corpus_text() -> str:
    """The bundled training corpus."""
    return resources.files(__package__).joinpath("corpus.txt").read_text("utf-8")


def chat_template_text() -> str:
    """The bundled ChatML chat template."""
    path = resources.files(__package__).joinpath("chat_template.jinja")
    return path.read_text("utf-8")


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


def _post_processor(shape: str, bos_id: int | None) -> Any:
    from tokenizers import processors

    byte_level = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if shape != "llama":
        return byte_level
    template = processors.TemplateProcessing(
        single=f"{BEGIN_OF_TEXT}:0 $A:0",
        pair=f"{BEGIN_OF_TEXT}:0 $A:0 {BEGIN_OF_TEXT}:1 $B:1",
        special_tokens=[(BEGIN_OF_TEXT, bos_id)],
    )
    return processors.Sequence([byte_level, template])


def build_tokenizer(shape: str = "qwen3", vocab_size: int = 512) -> Tokenizer:
    """Train a byte-level BPE whose total size (added tokens included) is ``vocab_size``.

    If the corpus cannot supply enough merges, ``<|reserved_N|>`` special tokens pad
    the vocabulary up to the requested size.
    """
    named = added_tokens(shape)
    base_size = vocab_size - len(named)
    if base_size < BYTE_ALPHABET_SIZE:
        raise ValueError(f"vocab_size must be at least {BYTE_ALPHABET_SIZE + len(named)}")
    tok = _train_bpe(base_size)
    _add_tokens(tok, named)
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    _add_tokens(tok, [(f"<|reserved_{i}|>", True) for i in range(missing)])
    ids = special_token_ids(tok)
    tok.post_processor = _post_processor(shape, ids.bos)
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:  # pragma: no cover
        raise RuntimeError("tokenizer vocabulary does not match vocab_size")
    return tok


def special_token_ids(tok: Tokenizer) -> SpecialTokens:
    """Ids of the special tokens in ``tok``."""
    return SpecialTokens(
        endoftext=tok.token_to_id(ENDOFTEXT),
        im_start=tok.token_to_id(IM_START),
        im_end=tok.token_to_id(IM_END),
        bos=tok.token_to_id(BEGIN_OF_TEXT),
    )


def tokenizer_config(shape: str, tok: Tokenizer, model_max_length: int) -> dict[str, Any]:
    """Contents of tokenizer_config.json for transformers' AutoTokenizer."""
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
        "add_bos_token": shape == "llama",
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": BEGIN_OF_TEXT if shape == "llama" else None,
        "chat_template": chat_template_text(),
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def special_tokens_map(shape: str) -> dict[str, Any]:
    """Contents of special_tokens_map.json."""
    out: dict[str, Any] = {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
    }
    if shape == "llama":
        out["bos_token"] = BEGIN_OF_TEXT
    return out
