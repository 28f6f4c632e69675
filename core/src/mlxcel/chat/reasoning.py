"""The reasoning split: an answer's text routed to its reasoning or to its answer, at the
markers of the model's ``ReasoningSpec`` (which spec a checkpoint has is
``mlxcel.model.reasoning``'s).

A splitter is fed an answer's pieces in order (``(text, is a special token's text)``) and
returns runs ``(kind, text, special)``: ``"reasoning"`` text, ``"answer"`` text (for the
tool parser and the content), or a ``"marker"`` (the markers themselves, which only
``--reasoning-format deepseek-legacy`` keeps in the content). A possible beginning of a
marker is held until the next text decides it, so the runs are the same however the text
was split into tokens.
"""

from __future__ import annotations

import re
from typing import Any

from mlxcel.families.api import ReasoningSpec
from mlxcel.model.reasoning import HARMONY_MESSAGE
from mlxcel.text import partial_suffix
from mlxcel.types.requests import ReasoningLimit

Run = tuple[str, str, bool]  # (kind, text, special)



class BlockSplitter:
    """``open`` ... ``close`` blocks (``ReasoningSpec.style`` ``"block"``); ``label``, when
    the model writes it right after ``open`` with a newline, is dropped as a marker."""

    def __init__(self, spec: ReasoningSpec, inside: bool = False) -> None:
        self.spec, self.inside = spec, inside
        self._held = ""
        self._labelling = False  # just opened: the label may follow

    def _marker(self) -> str:
        return self.spec.close if self.inside else self.spec.open

    def feed(self, text: str, special: bool) -> list[Run]:
        if special:
            out = self.flush()
            if text == self._marker():
                return [*out, *self._toggle(text)]
            return [*out, (self._kind(), text, True)]
        out: list[Run] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._labelling:
                buf = self._label(buf, out)
                if self._labelling:
                    return out
                continue
            i = buf.find(self._marker())
            if i < 0:
                break
            if i:
                out.append((self._kind(), buf[:i], False))
            marker, buf = buf[i:i + len(self._marker())], buf[i + len(self._marker()):]
            out += self._toggle(marker)
        keep = partial_suffix(buf, (self._marker(),))
        self._held = buf[len(buf) - keep:] if keep else ""
        if len(buf) > keep:
            out.append((self._kind(), buf[:len(buf) - keep], False))
        return out

    def flush(self) -> list[Run]:
        held, self._held = self._held, ""
        self._labelling = False
        return [(self._kind(), held, False)] if held else []

    def _kind(self) -> str:
        return "reasoning" if self.inside else "answer"

    def _toggle(self, marker: str) -> list[Run]:
        self.inside = not self.inside
        self._labelling = self.inside and bool(self.spec.label)
        return [("marker", marker, False)]

    def _label(self, buf: str, out: list[Run]) -> str:
        """Drop the label (and its newline) from the start of ``buf``; hold a prefix of it."""
        label = self.spec.label + "\n"
        if label.startswith(buf):
            self._held = buf
            return ""
        self._labelling = False
        if buf.startswith(label):
            out.append(("marker", label, False))
            return buf[len(label):]
        return buf


class HarmonySplitter:
    """gpt-oss messages (``ReasoningSpec.style`` ``"harmony"``): the generation prompt ends
    ``<|start|>assistant``, so the answer opens in a header. A header runs to
    ``<|message|>``; a body to an end marker (``<|end|>``, or ``<|call|>``/``<|return|>``,
    stop tokens whose text the answer never carries). A body on the reasoning channel is
    reasoning; any other header and end marker pass to the answer as special text (the
    tool parser reads them, the content drops them). Text that cannot be a header (a
    newline in it, or more than ``HEADER_LIMIT`` characters) is answer text."""

    START, MESSAGE, CONSTRAIN = "<|start|>", HARMONY_MESSAGE, "<|constrain|>"
    ENDS = ("<|end|>", "<|call|>", "<|return|>")
    HEADER_LIMIT = 256

    def __init__(self, spec: ReasoningSpec, inside: bool = False) -> None:
        del inside  # a harmony prompt never leaves a message open
        self.spec = spec
        self._state = "header"  # header | reasoning | answer (a body) | between
        self._head: list[tuple[str, bool]] = []
        self._channel = re.compile(re.escape(spec.open) + r"\s*([^\s<]*)")

    def feed(self, text: str, special: bool) -> list[Run]:
        if self._state == "header":
            return self._header(text, special)
        if special and (text in self.ENDS or text == self.spec.close):
            kind, self._state = self._state, "between"
            return [("marker", text, False)] if kind == "reasoning" else [("answer", text, True)]
        if special and self._state == "between" and text in (self.START, self.spec.open):
            self._state, self._head = "header", []
            return self._header(text, special)
        return [("reasoning" if self._state == "reasoning" else "answer", text, special)]

    def flush(self) -> list[Run]:
        if self._state != "header" or not self._head:
            return []
        return self._give_up()

    def _header(self, text: str, special: bool) -> list[Run]:
        self._head.append((text, special))
        if special and text == self.MESSAGE:
            head = "".join(t for t, _ in self._head)
            self._head = []
            match = self._channel.search(head)
            if match and match.group(1) == self.spec.label and "to=" not in head:
                self._state = "reasoning"
                return [("marker", head, False)]
            self._state = "answer"
            return [("answer", head, True)]
        plain = "".join(t for t, s in self._head if not s)
        if (not special and "\n" in text) or len(plain) > self.HEADER_LIMIT \
                or (special and text in self.ENDS):
            return self._give_up()
        return []

    def _give_up(self) -> list[Run]:
        """A header that is not one: its text is the answer's, as it came."""
        head, self._head, self._state = self._head, [], "between"
        return [("answer", t, s) for t, s in head]


SPLITTERS = {"block": BlockSplitter, "harmony": HarmonySplitter}


def splitter(spec: ReasoningSpec, inside: bool) -> Any:
    """The splitter of ``spec``'s style, starting inside a block when ``inside``."""
    try:
        return SPLITTERS[spec.style](spec, inside)
    except KeyError:
        raise ValueError(f"unknown reasoning style {spec.style!r} (known: "
                         f"{', '.join(SPLITTERS)})") from None


def prompt_opens(text: str, spec: ReasoningSpec | None) -> bool:
    """Whether a rendered prompt ends inside a reasoning block: its last open marker comes
    after its last close marker (compared without surrounding whitespace). A harmony
    prompt never does; None (a model without reasoning) is never open."""
    if spec is None or spec.style != "block":
        return False
    opening, closing = spec.open.strip(), spec.close.strip()
    return bool(opening) and text.rfind(opening) > text.rfind(closing)


def budget_limit(spec: ReasoningSpec | None, budget: int | None, tokenizer: Any,
                 inside: bool) -> ReasoningLimit | None:
    """The engine's reasoning limit for a budget of ``budget`` tokens (None or -1:
    unrestricted; a model without reasoning has nothing to limit). The forced close of a
    harmony analysis message also opens the final message, so the answer follows."""
    if spec is None or budget is None or budget < 0:
        return None
    if spec.style == "harmony":
        opening = spec.open + spec.label + HarmonySplitter.MESSAGE
        forced = spec.close + HarmonySplitter.START + "assistant" + spec.open + "final" \
            + HarmonySplitter.MESSAGE
    else:
        opening, forced = spec.open, spec.close
    return ReasoningLimit(budget=budget, open=opening, close=spec.close,
                          close_ids=tuple(tokenizer.encode(forced)), inside=inside)


def without_thinking(template_kwargs: dict[str, Any], budget: int | None) -> dict[str, Any]:
    """A budget of 0 also asks the template not to open reasoning (``enable_thinking``
    false, as llama-server does), unless the request set that variable itself."""
    if budget == 0 and "enable_thinking" not in template_kwargs:
        return {**template_kwargs, "enable_thinking": False}
    return template_kwargs
