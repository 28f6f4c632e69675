"""Tokenizer on top of the `tokenizers` library, with the checkpoint's special tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from mlxcel.errors import StartupError


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc


class Tokenizer:
    """Encode/decode plus the special tokens a server needs (BOS, EOS ids, template)."""

    def __init__(self, hf: HFTokenizer, config: dict, eos_ids: set[int]) -> None:
        self.hf = hf
        self.config = config
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_ids = set(eos_ids)
        if self.eos_token is not None:
            eos = hf.token_to_id(self.eos_token)
            if eos is not None:
                self.eos_ids.add(eos)
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: Path, eos_ids: set[int] | None = None) -> Tokenizer:
        file = path / "tokenizer.json"
        if not file.exists():
            raise StartupError(f"{path} has no tokenizer.json (a fast tokenizer is required)")
        hf = HFTokenizer.from_file(str(file))
        return cls(hf, _read_json(path / "tokenizer_config.json"), eos_ids or set())

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def first_invalid_id(self, ids: list[int]) -> int | None:
        """The first id outside ``[0, vocab_size)``, in request order."""
        for i in ids:
            if i < 0 or i >= self.vocab_size:
                return i
        return None
