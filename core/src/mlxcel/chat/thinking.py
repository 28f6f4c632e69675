"""Reasoning across turns: which earlier reasoning a prompt keeps, and whether the rendered
prompt leaves a reasoning block open.

``preserve_thinking`` (a template variable) true keeps every earlier assistant turn's
reasoning. False, the default, applies the Qwen3 rolling-checkpoint rule: only the turns
after the most recent user turn that is not a tool result keep it, since those models were
trained on prompts that drop the reasoning of finished exchanges. Templates that know no
reasoning (no ``<think>`` in their source) are left alone.
"""

from __future__ import annotations

import msgspec

from mlxcel.types.messages import Message, TextPart

OPEN, CLOSE = "<think>", "</think>"


def knows_reasoning(template_source: str) -> bool:
    return OPEN in template_source


def _is_query(message: Message) -> bool:
    """A user turn that is not a tool result in Qwen's wrapped form."""
    if message.role != "user":
        return False
    text = (message.text or "").strip()
    return not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))


def _without_reasoning(message: Message) -> Message:
    """The turn's text after its last ``</think>`` (blank lines after it dropped), the way
    Qwen's templates split reasoning from content, and no ``reasoning`` field."""
    parts = tuple(TextPart(text=p.text.split(CLOSE)[-1].lstrip("\n"))
                  if isinstance(p, TextPart) and CLOSE in p.text else p
                  for p in message.content or ())
    content = parts if message.content is not None else None
    return msgspec.structs.replace(message, content=content, reasoning=None)


def drop_earlier_reasoning(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The rolling-checkpoint rule: assistant turns before the most recent query (scanning
    from the end) lose their reasoning; without a query, nothing changes."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if _is_query(messages[i])), None)
    if last is None:
        return messages
    return tuple(_without_reasoning(m) if i < last and m.role == "assistant" else m
                 for i, m in enumerate(messages))
