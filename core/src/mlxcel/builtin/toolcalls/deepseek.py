"""DeepSeek's tool calls, between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``
(full-width ``｜`` and ``▁``: special tokens, so what they open is a call or a ``CallError``):

* V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`` per call;
* R1 (and its Qwen / Llama distills, V3 before it): ``<｜tool▁call▁begin｜>function
  <｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>`` per call, ``\\n`` between
  calls.

As llama.cpp reads them: the variants of the section marker the R1 distills write
(``<｜tool_calls_begin｜>``, ``<｜tool calls begin｜>``, ``<｜tool\\_calls\\_begin｜>``,
``<｜tool▁calls｜>``) open a section too, and the first call's ``<｜tool▁call▁begin｜>``
may be left out. A call outside any section still counts (``<｜tool▁call▁begin｜>`` is a
special token; so is a section's end a broken call leaves behind, dropped), and a
section the answer ends in after whole calls keeps them (R1's
template writes no ``<｜tool▁calls▁end｜>`` after a single call). The name streams when
``<｜tool▁sep｜>`` (V3.1) or its line's end (R1) settles it, the arguments as written.
"""

from __future__ import annotations

from typing import Any

from mlxcel.toolcalls.kit import NAME, StreamParser, partial_suffix

SECTIONS = ("<｜tool▁calls▁begin｜>", "<｜tool_calls_begin｜>", "<｜tool calls begin｜>",
            "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
SECTION_END = "<｜tool▁calls▁end｜>"
CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
FENCE = "```"


class DeepSeekParser(StreamParser):
    """V3.1's calls; ``R1Parser`` reads the fenced heads and bodies of R1's."""

    resync = (CALL_END, SECTION_END)
    openers = (*SECTIONS, CALL)
    dropped = (SECTION_END,)  # a section's end after a broken call: markup

    def opens(self, marker: str) -> Any:
        self._base = len(self._calls)
        return self._head if marker == CALL else self._section

    def _section(self) -> bool:
        """In a section: the next call, the section's end, or (the answer ends after whole
        calls) nothing more."""
        whole = len(self._calls) > self._base
        c = self.peek()
        if c is None:
            if self.final and whole:
                self.mark = -1
                return False
            return self.wait()
        call = self.match(CALL)
        if call:
            self.state = self._head
            return True
        end = self.match(SECTION_END)
        if end:
            return self.done_body()
        if call is None or end is None:
            return self.wait()
        if whole:  # text after the calls: the section is over
            self.pos = self.mark
            return self.done_body()
        self.state = self._head  # the first call's marker left out
        return True

    def head_name(self, stop: str) -> str | bool | None:
        """A name up to ``stop`` (consumed): None while the text so far could still be one
        (a partial ``stop`` at its end held), False once it cannot."""
        if self.buf.find(stop, self.pos) >= 0 or self.final:
            name = self.name_before(stop)
            if isinstance(name, str):
                self.pos += len(stop)
            return name
        head = self.buf[self.pos:]
        head = head[:len(head) - partial_suffix(head, (stop,))].strip()
        return None if (not head or NAME.fullmatch(head)) and len(head) < 256 else False

    def _head(self) -> bool:
        return self.begin_call(self.head_name(SEP), f"a call's name is not followed by {SEP}",
                               self._args)

    def _args(self) -> bool:
        return self.arguments(self._closed, f"{SEP} is not followed by a JSON object")

    def _closed(self) -> bool:
        """The call's arguments ended: its ``<｜tool▁call▁end｜>`` next."""
        self.mark = self.pos
        return self.close_call(CALL_END)

    def close_call(self, marker: str) -> bool:
        found = self.match(marker, skip_space=True)
        if found is None:
            return self.wait()
        if not found:
            if self.final and self.peek() is None:  # the answer ends after the JSON
                self.mark = -1
                return False
            return self.broken(f"a call's arguments are not followed by {marker}")
        self.mark = self.pos
        self.state = self._section
        return True


class R1Parser(DeepSeekParser):
    def _head(self) -> bool:
        """``function<｜tool▁sep｜>``: the call's type, any word."""
        return self.go(self.head_name(SEP), f"a call's type is not followed by {SEP}",
                       self._name)

    def _name(self) -> bool:
        return self.begin_call(self.head_name("\n"),
                               "a call's name is not followed by a new line", self._fence)

    def _fence(self) -> bool:
        found = self.match(FENCE + "json", skip_space=True)
        found = found if found is not False else self.match(FENCE, skip_space=True)
        return self.go(found, f"a call's name is not followed by {FENCE}json", self._args)

    def _args(self) -> bool:
        return self.arguments(self._closed, f"{FENCE}json is not followed by a JSON object")

    def _closed(self) -> bool:
        self.mark = self.pos
        found = self.match(FENCE, skip_space=True)
        if found is None:
            return self.wait()
        if not found:
            if self.final and self.peek() is None:
                self.mark = -1
                return False
            return self.broken(f"a call's arguments are not followed by {FENCE}")
        self.state = self._close
        return True

    def _close(self) -> bool:
        return self.close_call(CALL_END)


def new_parser_v3_1(tools: tuple[Any, ...] = ()) -> DeepSeekParser:
    return DeepSeekParser(tools)


def new_parser_r1(tools: tuple[Any, ...] = ()) -> R1Parser:
    return R1Parser(tools)
