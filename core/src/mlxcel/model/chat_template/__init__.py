"""HF-compatible chat templates rendered with jinja2 (no transformers needed), each with
its capabilities (``caps``), probed once when it loads."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2

from mlxcel.errors import InvalidRequest, StartupError
from mlxcel.model import chat_templates
from mlxcel.model.chat_template import jinja
from mlxcel.model.chat_template.caps import TemplateCaps, probe_caps

# Used when a checkpoint ships no template, as llama-server does.
FALLBACK_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplate:
    """A compiled chat template plus the special tokens templates expect."""

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None, origin: str = "checkpoint",
                 takes_tools: bool = True) -> None:
        self.source = source
        self.origin = origin
        self.takes_tools = takes_tools  # False: --no-jinja, where llama-server refuses tools
        self.special = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        try:
            self._template = jinja.environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise StartupError(f"chat template ({origin}) does not compile: "
                               f"{jinja.syntax_error(exc)}") from None
        self.reads = frozenset(name for name in jinja.LEGACY if name in source)

    @cached_property
    def caps(self) -> TemplateCaps:
        """What this template supports (``mlxcel.model.chat_template.caps``), probed once."""
        return probe_caps(self.render_raw)

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.source

    def render_raw(self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
                   add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """Render as given, without adaptation, raising what the template raises."""
        context: dict[str, Any] = {**jinja.legacy(self.reads, tools or [], kwargs), **kwargs,
                                   **self.special, "messages": messages,
                                   "add_generation_prompt": add_generation_prompt}
        if tools:
            context["tools"] = tools
        with jinja.given(context):
            return self._template.render(**context)

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render like transformers' ``apply_chat_template(tokenize=False)``.

        ``tools`` is passed to the template only when at least one tool is given; a
        template that takes none (``--no-jinja``) refuses them, as llama-server does.
        """
        if tools and not self.takes_tools:
            raise InvalidRequest("tools need a Jinja chat template: this server runs with "
                                 "--no-jinja (llama.cpp's built-in formats)", param="tools")
        try:
            return self.render_raw(messages, tools=tools,
                                   add_generation_prompt=add_generation_prompt, **kwargs)
        except jinja.TemplateRefusal as exc:
            raise InvalidRequest(f"the model's chat template refused these messages: {exc}",
                                 param="messages") from None
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"chat template error: {exc}", param="messages") from exc
        except RecursionError:
            raise InvalidRequest("chat template could not render these messages: they are "
                                 "nested too deeply", param="messages") from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidRequest(f"chat template could not render these messages: {exc}",
                                 param="messages") from exc


def _from_tokenizer_config(config: dict) -> str | None:
    value = config.get("chat_template")
    if isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


def _checkpoint_source(model_dir: Path, tokenizer_config: dict) -> tuple[str, str]:
    """``chat_template.jinja`` > ``chat_template.json`` (a processor's, as vision-language
    repos ship it) > tokenizer_config > ChatML, with where it came from."""
    if (model_dir / "chat_template.jinja").exists():
        return (model_dir / "chat_template.jinja").read_text(encoding="utf-8"), \
            "chat_template.jinja"
    source = _from_json_file(model_dir / "chat_template.json")
    if source:
        return source, "chat_template.json"
    source = _from_tokenizer_config(tokenizer_config)
    return (source, "tokenizer_config.json") if source else (FALLBACK_CHATML, "fallback-chatml")


def _from_json_file(path: Path) -> str | None:
    """The ``chat_template`` of a JSON file (None when there is none); a file that cannot
    be read as one is a startup error naming it, not a silent fallback."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc
    return _from_tokenizer_config(data) if isinstance(data, dict) else None


def _chosen_source(model_dir: Path, tokenizer_config: dict, override: Path | None,
                   template: str | None) -> tuple[str, str]:
    """``--chat-template-file`` > ``--chat-template`` (a built-in name or Jinja text) >
    the checkpoint's; giving both flags refuses to start, since one would be ignored."""
    if override is not None and template is not None:
        raise StartupError("give either --chat-template or --chat-template-file, not both")
    if override is not None:
        try:
            return Path(override).read_text(encoding="utf-8"), str(override)
        except OSError as exc:
            raise StartupError(f"cannot read --chat-template-file {override}: {exc}") from exc
    if template is not None:
        if template in chat_templates.BUILTIN_NAMES:
            return chat_templates.builtin_source(template), f"--chat-template {template}"
        return template, "--chat-template (inline)"
    return _checkpoint_source(model_dir, tokenizer_config)


def load_chat_template(model_dir: Path, tokenizer_config: dict, *, override: Path | None,
                       bos_token: str | None, eos_token: str | None,
                       template: str | None = None, jinja: bool = True) -> ChatTemplate:
    """The template to render with (see ``_chosen_source``). ``jinja`` False is
    llama-server's ``--no-jinja``: the built-in format that template's markers name
    (llama.cpp's detection), else ChatML as llama-server falls back, and no tools."""
    source, origin = _chosen_source(model_dir, tokenizer_config, override, template)
    if jinja:
        return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token, origin=origin)
    name = chat_templates.detect_builtin(source) or "chatml"
    return ChatTemplate(chat_templates.builtin_source(name), bos_token=bos_token,
                        eos_token=eos_token, origin=f"built-in {name} (--no-jinja, from {origin})",
                        takes_tools=False)
