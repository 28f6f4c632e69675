"""What the Anthropic tests share: a user turn, a tool, and the SSE reading a client does
(frames ``event: NAME`` + ``data: JSON``, and the SDK's accumulation rule)."""

from __future__ import annotations

import copy
import json

USER = {"role": "user", "content": "Hello there"}
TOOLS = [{"name": "get_time", "description": "The time in a zone.", "input_schema": {
    "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["tz"]}}]


def events(response) -> list[dict]:
    """The stream's events; each frame's event name must be its data's ``type``."""
    out = []
    for chunk in response.text.split("\n\n"):
        if not chunk.strip():
            continue
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        event = json.loads(data[len("data: "):])
        assert event["type"] == name[len("event: "):], chunk
        out.append(event)
    return out


def accumulate(evs: list[dict]) -> dict:
    """The message a client builds from the events, as the anthropic SDK does: blocks by
    index, text/thinking/signature deltas appended or set, tool input from the JSON
    fragments (parsed when the block stops), then the stop reason and usage of ``message_delta``."""
    message = None
    fragments: dict[int, str] = {}
    for ev in evs:
        kind = ev["type"]
        if kind == "message_start":
            message = copy.deepcopy(ev["message"])
        elif kind == "content_block_start":
            message["content"].append(copy.deepcopy(ev["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][ev["index"]], ev["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                fragments[ev["index"]] = fragments.get(ev["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and ev["index"] in fragments:
            message["content"][ev["index"]]["input"] = json.loads(fragments[ev["index"]])
        elif kind == "message_delta":
            message.update(ev["delta"])
            message["usage"].update(ev["usage"])
    return message
