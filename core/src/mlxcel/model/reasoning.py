"""Which reasoning markers a checkpoint's answers carry: the family's ``ReasoningSpec``,
else what its chat template and vocabulary show. Chosen once at load, with the model."""

from __future__ import annotations

from typing import Any

from mlxcel.families.api import ReasoningSpec

# (open, close) pairs that mark reasoning blocks, as mlx-lm's tokenizer wrapper knows them
BLOCK_MARKERS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
                 ("<|think:start|>", "<|think:end|>"), ("[THINK]", "[/THINK]"),
                 ("<seed:think>", "</seed:think>"))
HARMONY = ReasoningSpec(open="<|channel|>", close="<|end|>", label="analysis", style="harmony")
HARMONY_MESSAGE = "<|message|>"  # ends a harmony message header


def detect(template_source: str, vocab: Any) -> tuple[ReasoningSpec | None, str]:
    """The reasoning spec a chat template and vocabulary show, and why: harmony channels,
    or a known block pair whose markers are both tokens of the vocabulary and whose open
    marker the template writes (a vocabulary may carry ``<think>`` for a model that was
    never taught to use it)."""
    if HARMONY.open in template_source and HARMONY.label in template_source \
            and all(m in vocab for m in (HARMONY.open, HARMONY_MESSAGE, HARMONY.close)):
        return HARMONY, "the chat template writes harmony channels"
    for opening, closing in BLOCK_MARKERS:
        if opening in vocab and closing in vocab and opening in template_source:
            return (ReasoningSpec(open=opening, close=closing),
                    f"the chat template writes {opening} and the vocabulary has {closing}")
    return None, "no reasoning markers in the chat template"


def select(family_spec: ReasoningSpec | None, template_source: str, vocab: Any
           ) -> tuple[ReasoningSpec | None, str]:
    """A checkpoint's reasoning spec and why: the family's, else what ``detect`` finds.
    (``--reasoning-format none`` keeps the spec, for budgets, and splits nothing.)"""
    if family_spec is not None:
        return family_spec, "the family's"
    return detect(template_source, vocab)
