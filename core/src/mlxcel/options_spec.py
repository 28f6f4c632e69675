"""Speculative decoding's rows of the options table (``mlxcel.options``): the drafter and
how far it drafts (``mlxcel.engine.speculative``). Row format as the table's: (flags,
dest, type, default, env twin, help[, llama kind[, second env twin]]).
"""

from __future__ import annotations

from typing import Any

from mlxcel.option_types import KEPT, Toggle, choice, path

SPEC_ROWS: list[tuple[Any, ...]] = [
    (("--prompt-lookup",), "prompt_lookup", choice("--prompt-lookup", "auto", "on", "off"),
     "auto", "MLXCEL_PROMPT_LOOKUP",
     "speculative decoding from the context's own n-grams: auto = each row drafts while its "
     "drafts are accepted, and a batch stops drafting where verifying costs more per token "
     "than one-token steps, and only where a verify forward rounds as a one-token step does "
     "(greedy output unchanged); on = rows draft whatever the cost or rounding; off = never"),
    (("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max"), "draft_max", int, 16,
     "LLAMA_ARG_SPEC_DRAFT_N_MAX", "most tokens a row drafts in one round", KEPT,
     "LLAMA_ARG_DRAFT_MAX"),
    (("--draft-min", "--spec-draft-n-min"), "draft_min", int, 0, "LLAMA_ARG_SPEC_DRAFT_N_MIN",
     "fewest tokens a draft must have to be verified", KEPT),
    (("-md", "--model-draft", "--draft-model", "--spec-draft-model"), "model_draft", path,
     None, "LLAMA_ARG_SPEC_DRAFT_MODEL",
     "draft model checkpoint for speculative decoding (a directory or a Hugging Face id; "
     "its tokenizer must be the target's), an MTP assistant or a DFlash drafter (its "
     "model_type picks its drafter: --draft-kind); rows draft with it instead of prompt "
     "lookup",
     KEPT, "LLAMA_ARG_MODEL_DRAFT"),
    (("--draft-force",), "draft_force", Toggle(), False, "MLXCEL_DRAFT_FORCE",
     "serve a drafter whose startup exactness probe failed (greedy output with it differed "
     "from the target's own); without it such a pairing refuses to start"),
    (("--draft-kind",), "draft_kind", choice("--draft-kind", "dflash", "mtp"), None,
     "MLXCEL_DRAFT_KIND", "what the -md checkpoint drafts as: mtp = an MTP assistant "
     "(Gemma 4's gemma4_assistant); dflash = a DFlash block drafter (a Qwen3 or Gemma 4 "
     "DFlash checkpoint, served by mlxcel-drafter-mtp). Unset: from its config's model_type",
     KEPT, "LLAMA_ARG_DRAFT_KIND"),
    (("--draft-block-size",), "draft_block_size", int, 0, "MLXCEL_DRAFT_BLOCK_SIZE",
     "block width of a block drafter (DFlash): it drafts at most this many tokens less "
     "one per round, within --draft-max; 0 = the drafter checkpoint's own", KEPT,
     "LLAMA_ARG_DRAFT_BLOCK_SIZE"),
    (("--spec-type",), "spec_type", choice("--spec-type", "none", "draft-mtp", "draft-dflash"),
     None, "MLXCEL_SPEC_TYPE", "llama-server's drafter choice: draft-mtp = MTP (as --draft-kind "
     "mtp): -md an MTP assistant, else the target's own MTP heads; draft-dflash = DFlash "
     "(as --draft-kind dflash): -md a DFlash checkpoint; none = no drafter checkpoint",
     KEPT),
]
