"""Compaction rules: what a compacted history keeps, where it may be split, the capsule
that carries the summary, and how a compaction item is replayed.

- Kept: every system and developer message, the last user message, and the newest
  complete turns whose tokens fit ``keep_tokens``. The history is split only before a
  user message or right after a complete tool-call group (every call's output arrived),
  and never while a call waits for its output, so a function call stays with its output.
- Dropped: the rest, which one generation summarizes.
- The result: the system and developer messages, the kept items, and one compaction item
  whose ``encrypted_content`` is a base64url capsule (JSON, not encrypted) holding the
  summary and the kept items.
- Replay: a compaction item stands for the whole history before it, so the items before
  it (but system and developer messages) give way to its summary (a user message) and
  the items it kept. A client may send the compacted output back as it came, or only the
  compaction item, and the model sees the same history.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from mlxcel.errors import InvalidRequest

from .items import is_instruction, is_user, normalize, part_text, reasoning_text

Item = dict[str, Any]
SUMMARY_LEAD = "Summary of the earlier conversation:\n\n"
SUMMARY_REQUEST = (
    "Summarize the conversation above for another assistant who will continue it without "
    "seeing it. Keep the user's goal and requirements, decisions made, work done, exact "
    "names, identifiers and values, open questions and next steps. Do not continue the "
    "task or call tools. Answer with the summary only.")


class Capsule(msgspec.Struct, kw_only=True):
    summary: str
    items: list[Item]


def capsule(summary: str, kept: list[Item]) -> str:
    raw = msgspec.json.encode(Capsule(summary=summary, items=kept))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def open_capsule(text: str, where: str) -> Capsule:
    """A capsule's summary and kept items, checked as input items are (400 naming
    ``where`` when it is not one this server made)."""
    bad = InvalidRequest(f"'{where}' is not a compaction capsule made by this server",
                         param=where)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        found = msgspec.json.decode(raw, type=Capsule)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise bad from None
    items = [normalize(item, f"{where}.items[{i}]") for i, item in enumerate(found.items)]
    if any(item["type"] == "compaction" for item in items):
        raise bad
    return Capsule(summary=found.summary, items=items)


def compaction_item(summary: str, kept: list[Item]) -> Item:
    return {"id": f"cmp_{uuid.uuid4().hex}", "type": "compaction",
            "encrypted_content": capsule(summary, kept)}


def summary_item(summary: str) -> Item:
    return {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": SUMMARY_LEAD + summary}]}


def replay(items: list[Item]) -> list[Item]:
    """The history a model sees: the last compaction item stands for everything before
    it but the system and developer messages (see the module's rules)."""
    at = next((i for i in range(len(items) - 1, -1, -1)
               if items[i]["type"] == "compaction"), None)
    if at is None:
        return items
    found = open_capsule(items[at]["encrypted_content"], "compaction.encrypted_content")
    return [*(item for item in items[:at] if is_instruction(item)),
            summary_item(found.summary), *found.items, *items[at + 1:]]


def item_text(item: Item) -> str:
    """The text of an item that its tokens are counted on."""
    kind = item["type"]
    if kind == "message":
        return "".join(part_text(p) for p in item["content"])
    if kind == "function_call":
        return item["name"] + item["arguments"]
    if kind == "function_call_output":
        output = item["output"]
        return output if isinstance(output, str) else "".join(part_text(p) for p in output)
    if kind == "reasoning":
        return reasoning_text(item)
    return ""


def split_points(conversation: list[Item]) -> list[int]:
    """Where ``conversation`` (no system or developer messages) may be split: before a
    user message, right after the output that completes a tool-call group, and at its
    end; never while a call waits for its output."""
    pending: set[str] = set()
    points: list[int] = []
    for i, item in enumerate(conversation):
        if is_user(item) and not pending:
            points.append(i)
        if item["type"] == "function_call":
            pending.add(item["call_id"])
        elif item["type"] == "function_call_output" and item["call_id"] in pending:
            pending.discard(item["call_id"])
            if not pending:
                points.append(i + 1)
    if not pending:
        points.append(len(conversation))
    return sorted(set(points))


class Plan(msgspec.Struct, kw_only=True):
    instructions: list[Item]
    kept: list[Item]
    dropped: list[Item]


def plan(items: list[Item], keep_tokens: int, tokens: Callable[[Item], int]) -> Plan:
    """The split of a (replayed) history: the earliest split point whose newest turns fit
    ``keep_tokens`` (the last user message is kept whatever its size, so it is not
    counted); with none, the latest split point."""
    instructions = [item for item in items if is_instruction(item)]
    conversation = [item for item in items if not is_instruction(item)]
    users = [i for i, item in enumerate(conversation) if is_user(item)]
    last = users[-1] if users else -1
    points = split_points(conversation)
    if not points:
        return Plan(instructions=instructions, kept=conversation, dropped=[])
    suffix = [0] * (len(conversation) + 1)  # tokens from each index to the end
    for i in range(len(conversation) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + (0 if i == last else tokens(conversation[i]))
    cut = points[-1]
    for point in reversed(points):
        if suffix[point] > keep_tokens:
            break
        cut = point
    lead = [conversation[last]] if 0 <= last < cut else []
    return Plan(instructions=instructions, kept=lead + conversation[cut:],
                dropped=[item for i, item in enumerate(conversation[:cut]) if i != last])


def summary_request_items(p: Plan) -> list[Item]:
    """What the summary generation reads: the instructions, the dropped items, and the
    request for a summary."""
    ask = {"type": "message", "role": "user",
           "content": [{"type": "input_text", "text": SUMMARY_REQUEST}]}
    return [*p.instructions, *p.dropped, ask]


def compacted(p: Plan, summary: str) -> list[Item]:
    return [*p.instructions, *p.kept, compaction_item(summary, p.kept)]
