"""Reasoning's rows of the options table (``mlxcel.options``): where reasoning goes, its
budget, and ``--reasoning`` / ``--reasoning-effort``, which the server's parser folds into
the server-wide chat-template variables. Row format as the table's: (flags, dest, type,
default, env twin, help[, llama kind[, second env twin]]).
"""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.option_types import KEPT, MAPPED, choice, path, reasoning_budget, reasoning_mode

REASONING_ROWS: list[tuple[Any, ...]] = [
    (("--reasoning-format",), "reasoning_format", choice("reasoning_format", "auto", "deepseek", "deepseek-legacy", "none"), "auto",
     "LLAMA_ARG_THINK",
     "where reasoning goes: auto or deepseek = message.reasoning_content (split at the "
     "model's markers), deepseek-legacy = there and left in the content too, none = left "
     "in the content", KEPT),
    (("--reasoning-budget",), "reasoning_budget", reasoning_budget, -1,
     "LLAMA_ARG_THINK_BUDGET",
     "reasoning tokens an answer may generate before its reasoning block is closed for "
     "it: -1 = unrestricted, 0 = end it at once; a request's thinking budget wins", KEPT),
    (("-rea", "--reasoning"), "reasoning", reasoning_mode, "auto", "LLAMA_ARG_REASONING",
     "on or off: render every chat template with enable_thinking true or false (a "
     "request's chat_template_kwargs win); auto leaves it to the template", MAPPED),
    (("--reasoning-effort",), "reasoning_effort", path, "default",
     "LLAMA_ARG_REASONING_EFFORT",
     "reasoning effort given to every chat template as reasoning_effort (minimal, low, "
     "medium, high, ...; a request's chat_template_kwargs win); default: the template's",
     MAPPED),
]


def _thinking(value: Any) -> bool:
    return value is True or str(value).strip().lower() == "true"


class _ServerParser(argparse.ArgumentParser):
    """``--reasoning on|off`` and ``--reasoning-effort LEVEL`` are folded into the
    server-wide chat-template variables (``enable_thinking``, ``reasoning_effort``), as
    llama-server folds them into its default template kwargs, so every dialect renders
    with them; a variable that ``--chat-template-kwargs`` sets the other way is refused
    rather than one of the two being silently dropped."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = super().parse_known_args(args, namespace)
        kwargs = dict(ns.chat_template_kwargs or {})
        mode = getattr(ns, "reasoning", "auto")
        if mode != "auto":
            on = mode == "on"
            if "enable_thinking" in kwargs and _thinking(kwargs["enable_thinking"]) != on:
                self.error(f"--reasoning {mode} contradicts --chat-template-kwargs' "
                           f"enable_thinking; give one of them")
            kwargs["enable_thinking"] = on
        effort = getattr(ns, "reasoning_effort", "default")
        if effort and effort != "default":
            if kwargs.get("reasoning_effort", effort) != effort:
                self.error(f"--reasoning-effort {effort} contradicts --chat-template-kwargs' "
                           f"reasoning_effort; give one of them")
            kwargs["reasoning_effort"] = effort
        if kwargs:
            ns.chat_template_kwargs = kwargs
        return ns, rest
