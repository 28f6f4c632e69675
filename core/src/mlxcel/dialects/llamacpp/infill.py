"""Fill-in-the-middle for ``/infill``: the vocabulary's FIM markers and the prompt built
from them.

Markers are found by their text in the vocabulary, the spellings of the families that
have them (Qwen ``<|fim_prefix|>``, StarCoder and Granite ``<fim_prefix>``, CodeLlama
``<PRE>``, DeepSeek ``<｜fim▁begin｜>``, GLM ``<|code_prefix|>``, ...). The prompt is
the repo-level pattern when the vocabulary has a repo and a file-separator marker::

    <repo>myproject\\n<sep>{file}\\n{text}...<sep>filename\\n<pre>{prefix}<suf>{suffix}<mid>{prompt}

and otherwise ``input_extra`` chunks joined by a plain-text separator before ``<pre>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel.errors import CapabilityNotSupported

from .completion import fits, mixed_tokens
from .schemas import InfillRequest

MARKERS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
               "▁<MID>", "<|code_middle|>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}
REQUIRED = ("prefix", "suffix", "middle")
PROJECT, FILENAME = "myproject", "filename"  # what the repo-level pattern names
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks without a separator token
PREFIX_SHARE = 3 / 4  # of the room left for prefix and suffix when both must be cut


@dataclass(frozen=True)
class Fim:
    prefix: int
    suffix: int
    middle: int
    repo: int | None
    file_sep: int | None


def fim_markers(tok: Any) -> Fim:
    """The vocabulary's FIM token ids; without a prefix, suffix or middle marker the
    model cannot infill: 501 naming what is missing."""
    found = {role: next((i for t in texts if (i := tok.hf.token_to_id(t)) is not None), None)
             for role, texts in MARKERS.items()}
    missing = [role for role in REQUIRED if found[role] is None]
    if missing:
        wanted = "; ".join(f"{role}: one of {' '.join(MARKERS[role])}" for role in missing)
        raise CapabilityNotSupported(
            "Infill is not supported by this model: its vocabulary has no fill-in-the-middle "
            f"{', '.join(missing)} token ({wanted})")
    return Fim(**found)


def _extra(engine: Any, body: InfillRequest, fim: Fim) -> list[int]:
    """The context before the prefix marker: repo name, then each extra file."""
    def text(value: str) -> list[int]:
        return mixed_tokens(engine, [value], "input_extra", bos=False, bounded=False)

    out = [fim.repo, *text(PROJECT + "\n")] if fim.repo is not None else []
    for chunk in body.input_extra:
        if fim.file_sep is not None:
            out += [fim.file_sep, *text(chunk.filename + "\n")]
        else:
            out += text(CHUNK_SEPARATOR)
        out += text(chunk.text)
    if fim.file_sep is not None:
        out += [fim.file_sep, *text(FILENAME + "\n")]
    return out


def _cut(prefix: list[int], suffix: list[int], room: int) -> tuple[list[int], list[int]]:
    """Prefix and suffix within ``room`` tokens: the prefix keeps its end (the code just
    before the cursor), the suffix its start; each gets its share when both are long."""
    if len(prefix) + len(suffix) <= room:
        return prefix, suffix
    keep_prefix = max(int(room * PREFIX_SHARE), room - len(suffix))
    keep_prefix = min(keep_prefix, len(prefix))
    keep_suffix = room - keep_prefix
    return prefix[len(prefix) - keep_prefix:], suffix[:keep_suffix]


def infill_prompt(engine: Any, body: InfillRequest, fim: Fim, reserve: int
                  ) -> tuple[list[int], bool]:
    """The infill prompt's ids, and whether the input was cut to fit the context window
    less ``reserve`` tokens for the answer (blocking work: run it through ``prepare``)."""
    def mixed(value: Any, param: str) -> list[int]:
        return mixed_tokens(engine, [value] if isinstance(value, str) else value, param,
                            bos=False, bounded=False)

    prefix, suffix = mixed(body.input_prefix, "input_prefix"), mixed(body.input_suffix,
                                                                      "input_suffix")
    prompt = mixed(body.prompt, "prompt") if body.prompt else []
    extra = _extra(engine, body, fim)
    bos = engine.checkpoint.tokenizer.encode("", True)  # the tokenizer's own BOS, if any
    room = engine.context_size - 1 - reserve - len(bos) - len(prompt) - 3
    kept_prefix, kept_suffix = _cut(prefix, suffix, max(room, 0))
    room_extra = max(room - len(kept_prefix) - len(kept_suffix), 0)
    kept_extra = extra[len(extra) - room_extra:] if room_extra < len(extra) else extra
    ids = [*bos, *kept_extra, fim.prefix, *kept_prefix, fim.suffix, *kept_suffix,
           fim.middle, *prompt]
    truncated = (len(kept_prefix), len(kept_suffix), len(kept_extra)) != (
        len(prefix), len(suffix), len(extra))
    return fits(engine, ids, "input_prefix"), truncated


def answer_reserve(context_size: int, n_predict: int) -> int:
    """Tokens kept free for the answer: ``n_predict``, at most a quarter of the context
    (a quarter when it is unlimited)."""
    quarter = context_size // 4
    return quarter if n_predict < 0 else min(n_predict, quarter)
