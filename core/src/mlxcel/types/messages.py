"""A chat request as the chat layer reads it, whatever dialect it came in: typed messages,
content parts, tools and the tool choice, and what the rendered prompt hands on.

A dialect maps its wire fields to these (``mlxcel.chat.prompt`` renders them); nothing in
them is wire-shaped, except ``Tool.definition``, the function tool in the chat-completions
shape that Hugging Face chat templates read.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from mlxcel.types.media import MediaPrompt

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(msgspec.Struct, frozen=True, kw_only=True, tag="text"):
    text: str


class MediaPart(msgspec.Struct, frozen=True, kw_only=True):
    """A media reference as the client gave it, decoded by nothing yet: a URL (``data:``
    URLs included), or base64 ``data`` with its ``format`` (a file extension or a MIME
    type, as given). ``wire_type`` is the client's own name for the part and ``path`` its
    place in the client's request (``messages[2].content[0].content[1]``) where that is
    not ``messages[i].content[j]`` of the chat layer's messages, so that a refusal speaks
    the client's vocabulary."""

    url: str | None = None
    data: str | None = None
    format: str | None = None
    wire_type: str | None = None
    path: str | None = None


class ImagePart(MediaPart, frozen=True, kw_only=True, tag="image"):
    pass


class AudioPart(MediaPart, frozen=True, kw_only=True, tag="audio"):
    pass


class VideoPart(MediaPart, frozen=True, kw_only=True, tag="video"):
    pass


Part = TextPart | ImagePart | AudioPart | VideoPart


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call an earlier assistant turn made: ``arguments`` is the parsed JSON object, or
    the string as given when it is not one (templates print either)."""

    id: str | None = None
    name: str
    arguments: Any = None


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One turn. ``content`` None is a turn without content (an assistant turn that only
    calls tools); ``reasoning`` is the turn's reasoning text (OpenAI's
    ``reasoning_content``)."""

    role: Role
    content: tuple[Part, ...] | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None

    @property
    def text(self) -> str | None:
        """The text parts joined (None without content)."""
        if self.content is None:
            return None
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """A function tool: its ``name`` (what a tool choice names) and its ``definition``,
    ``{"type": "function", "function": {"name", "description", "parameters"}}``, the
    entry a template's ``tools`` list holds."""

    name: str
    definition: dict[str, Any]


class FunctionChoice(msgspec.Struct, frozen=True, kw_only=True):
    """A tool choice that names the one function the model must call."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | FunctionChoice


class PromptRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the chat layer renders. ``template_kwargs`` are the request's own template
    variables (merged over the server's when rendered); ``add_generation_prompt`` None
    means true, unless ``continue_final_message`` asks to continue the last turn.
    ``continue_final_message`` None is llama-server's assistant prefill: a final assistant
    message is continued unless ``add_generation_prompt`` is given (``chat.prompt``)."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = "auto"
    template_kwargs: dict[str, Any] = {}
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = False
    # the request's media knobs (``chat.media.MEDIA_OPTIONS``: ``max_soft_tokens``)
    media_options: dict[str, Any] = {}


class PromptInput(msgspec.Struct, frozen=True, kw_only=True):
    """The rendered prompt's token ids and what it implies for the output: the ``tools``
    it declared (after ``tool_choice``: the calls a tool parser may report), and
    ``reasoning_open`` when it ends inside an open reasoning block, so the first generated
    tokens are reasoning."""

    token_ids: tuple[int, ...]
    tools: tuple[Tool, ...] = ()
    forced: bool = False  # tool_choice requires a call (``required`` or a named function)
    reasoning_open: bool = False
    # (token count, kind) of the message boundaries later prompts share (chat.cache_marks)
    cache_marks: tuple[tuple[int, str], ...] = ()
    media: MediaPrompt | None = None  # the prompt's media, expanded (chat.media)
