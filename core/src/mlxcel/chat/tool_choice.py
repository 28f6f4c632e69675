"""``tool_choice`` is enforced, not echoed: it decides which tools the template renders and
whether the prompt tells the model to call one.

=======================  ==============  =================================================
choice                   tools rendered  prompt
=======================  ==============  =================================================
``"auto"`` (or absent)   all             unchanged; the model decides
``"none"``               none            unchanged
``"required"``           all             a directive to call at least one declared function
named function ``f``     only ``f``      a directive to call ``f``
=======================  ==============  =================================================

``"required"`` without tools, and a name that is empty or not declared, are 400s. The
directive goes into the first system message, else the last user message, else a new
leading system message; the request's own messages are never changed (new ones are made).
"""

from __future__ import annotations

import msgspec

from mlxcel.errors import InvalidRequest
from mlxcel.types.messages import FunctionChoice, Message, TextPart, Tool, ToolChoice

PARAM = "tool_choice"


def _required(tools: tuple[Tool, ...]) -> str:
    if not tools:
        raise InvalidRequest("'tool_choice' \"required\" needs at least one tool in 'tools'",
                             param=PARAM)
    names = ", ".join(tool.name for tool in tools)
    return f"You must call at least one of the declared functions ({names}) in this reply."


def _named(choice: FunctionChoice, tools: tuple[Tool, ...]) -> tuple[Tool, ...]:
    if not choice.name:
        raise InvalidRequest("'tool_choice' must name a function: the name is empty",
                             param=PARAM)
    chosen = tuple(tool for tool in tools if tool.name == choice.name)
    if not chosen:
        raise InvalidRequest("'tool_choice' names a function that is not declared in 'tools'",
                             param=PARAM)
    return chosen[:1]


def _append(message: Message, directive: str) -> Message:
    """``message`` with the directive after its text (a blank line between them)."""
    separator = "\n\n" if message.text else ""
    parts = (*(message.content or ()), TextPart(text=separator + directive))
    return msgspec.structs.replace(message, content=parts)


def place_directive(messages: tuple[Message, ...], directive: str) -> tuple[Message, ...]:
    """The directive in the first system message, else the last user message, else a new
    leading system message: where a template shows instructions to the model."""
    roles = [m.role for m in messages]
    if "system" in roles:
        at = roles.index("system")
    elif "user" in roles:
        at = len(roles) - 1 - roles[::-1].index("user")
    else:
        return (Message(role="system", content=(TextPart(text=directive),)), *messages)
    return (*messages[:at], _append(messages[at], directive), *messages[at + 1:])


def apply_tool_choice(messages: tuple[Message, ...], tools: tuple[Tool, ...],
                      choice: ToolChoice) -> tuple[tuple[Message, ...], tuple[Tool, ...]]:
    """The messages and tools to render under ``choice`` (see the module's table)."""
    if choice == "auto":
        return messages, tools
    if choice == "none":
        return messages, ()
    if choice == "required":
        return place_directive(messages, _required(tools)), tools
    if isinstance(choice, FunctionChoice):
        chosen = _named(choice, tools)
        directive = f"You must call the function {chosen[0].name} in this reply."
        return place_directive(messages, directive), chosen
    raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\" or a named "
                         "function", param=PARAM)
