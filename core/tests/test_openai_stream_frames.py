"""The OpenAI chat stream's text frames: the bytes of encoding the whole chunk, whatever
the text holds and whatever the response's id and model name are."""

from __future__ import annotations

import json

import pytest
from mlxcel.dialects.openai import schemas as s
from mlxcel.dialects.openai.stream import ChatEncoder
from mlxcel.dialects.wire import sse
from mlxcel.types import ContentDelta, ReasoningDelta

TEXTS = ["", "a", ' quo"te \\ back', "é\n\t\x00\x1f", "\u2028\u2029", "😀 </think>", "\ud7ff"]
MODELS = ["tiny", 'we"ird\\model', "\x00mlxcel-text\x00"]


def whole_chunk(enc: ChatEncoder, delta: s.Delta) -> bytes:
    return sse(s.ChatCompletionChunk(enc.rid, enc.created, enc.model,
                                     [s.ChunkChoice(0, delta, None, None)]))


@pytest.mark.parametrize("model", MODELS)
def test_text_frames_are_the_whole_chunks_bytes(model):
    enc = ChatEncoder("chatcmpl-1", 1700000000, model, None, include_usage=False)
    for text in TEXTS:
        assert enc.encode([ContentDelta(text=text)]) == \
            [whole_chunk(enc, s.Delta(content=text))]
        assert enc.encode([ReasoningDelta(text=text)]) == \
            [whole_chunk(enc, s.Delta(reasoning_content=text))]


def test_a_text_frame_parses_back_to_its_text():
    enc = ChatEncoder("chatcmpl-2", 1, "m", None, include_usage=False)
    for text in TEXTS:
        (frame,) = enc.encode([ContentDelta(text=text)])
        body = json.loads(frame.removeprefix(b"data: "))
        assert body["choices"][0]["delta"] == {"content": text}
        assert body["model"] == "m" and body["object"] == "chat.completion.chunk"
