"""A ``TokenVocabulary`` as llguidance's tokenizer: the same raw bytes outlines-core gets.

llguidance reads a tokenizer as a list of token bytes (one per id), the ids that are
special, and a function that tokenizes bytes. The bytes are the vocabulary's (so a grammar
allows the tokens a JSON schema would for the same text); every id the vocabulary leaves
out (added tokens, the EOS ids, the unknown token, holes in the id range) is special,
which llguidance never matches against grammar text, as outlines-core never sees them.

The tokenize function is used only on text the grammar forces (to fast-forward it and
to check that a forced prefix is reachable); it is a greedy longest match over the same
bytes, so it never needs the model's tokenizer in a compile worker and always decodes
back to its input.
"""

from __future__ import annotations

import llguidance

from mlxcel.engine.constraints.vocabulary import TokenVocabulary
from mlxcel.errors import UnsupportedSchema


class _Tokens:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer object."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self.eos_token_id = min(vocabulary.eos_ids)
        self.bos_token_id = None
        named = {i: text.encode() for text, i in vocabulary.added.items()}
        texts = vocabulary.tokens
        self.tokens = [texts.get(i) or named.get(i) or f"<[{i}]>".encode()
                       for i in range(vocabulary.size)]
        self.special_token_ids = [i for i in range(vocabulary.size) if not texts.get(i)]
        self._ids: dict[bytes, int] = {}
        for i in sorted(texts):
            if texts[i]:
                self._ids.setdefault(texts[i], i)
        self._longest = max((len(raw) for raw in self._ids), default=1)

    def __call__(self, text: bytes | str) -> list[int]:
        """Greedy longest-match token ids of ``text``; a byte no token holds is skipped
        (no grammar can force it through this vocabulary)."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        out: list[int] = []
        at = 0
        while at < len(data):
            for end in range(min(len(data), at + self._longest), at, -1):
                token = self._ids.get(data[at:end])
                if token is not None:
                    out.append(token)
                    at = end
                    break
            else:
                at += 1
        return out


def llguidance_tokenizer(vocabulary: TokenVocabulary) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over ``vocabulary``'s bytes, every EOS id an end."""
    if not vocabulary.eos_ids:
        raise UnsupportedSchema("constrained decoding needs a model with an end-of-sequence "
                                "token")
    wrapper = llguidance.TokenizerWrapper(_Tokens(vocabulary))
    return llguidance.LLTokenizer(wrapper, n_vocab=vocabulary.size,
                                  eos_token=sorted(vocabulary.eos_ids))
