"""A model's tool format is chosen once, at startup: ``--tool-call-format``, else the
family's default, else the most specific format its chat template shows; a tie or an
unknown name refuses to start. The choice rides on the loaded checkpoint, is logged, and
``/health`` says whether there is one."""

from __future__ import annotations

import pytest
from mlxcel.errors import StartupError
from mlxcel.families.api import Family
from mlxcel.model.chat_template import ChatTemplate
from mlxcel.model.loader import load_checkpoint, select_tool_format
from mlxcel.toolcalls.api import ToolFormat
from mlxcel.toolcalls.registry import ToolFormatRegistry

# Real-shaped markers: a Qwen3-Coder template writes <function= inside <tool_call>, so it
# also matches the Hermes format, which must lose to the more specific one.
HERMES = ToolFormat(name="hermes", detect=lambda t: "<tool_call>" in t,
                    parser="mlxcel.nowhere:new_parser")
CODER = ToolFormat(name="qwen3-coder", detect=lambda t: "<function=" in t,
                   parser="mlxcel.nowhere:new_parser", specificity=30)
ACME = ToolFormat(name="acme-xml", detect=lambda t: "<acme_call>" in t,
                  parser="mlxcel.nowhere:new_parser")
ACME_TOO = ToolFormat(name="acme-json", detect=lambda t: "<acme_call>" in t,
                      parser="mlxcel.nowhere:new_parser")

HERMES_TEMPLATE = "{% if tools %}<tool_call>{json}</tool_call>{% endif %}"
CODER_TEMPLATE = "{% if tools %}<tool_call>\n<function=name>\n</function></tool_call>{% endif %}"
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"


def _registry(*formats: ToolFormat) -> ToolFormatRegistry:
    registry = ToolFormatRegistry()
    for fmt in formats:
        registry.add(fmt)
    return registry


def _pick(formats, template, flag=None, default=None):
    family = Family(name="fam", model_types=("x",), load="mlxcel.nowhere:load",
                    tasks={"generate": "mlxcel.nowhere:decoder"},
                    default_tool_format=default)
    fmt, why = select_tool_format(formats, family, ChatTemplate(template), flag)
    return (fmt.name if fmt else None), why


def test_the_flag_wins_over_the_family_default_and_detection():
    formats = _registry(HERMES, CODER, ACME)
    assert _pick(formats, CODER_TEMPLATE, flag="acme-xml", default="hermes") == \
        ("acme-xml", "--tool-call-format")


def test_the_family_default_wins_over_detection_when_installed():
    formats = _registry(HERMES, CODER, ACME)
    assert _pick(formats, CODER_TEMPLATE, default="acme-xml") == \
        ("acme-xml", "the model family's default")
    # a default that is not installed falls through to the template
    assert _pick(formats, CODER_TEMPLATE, default="gemma4") == \
        ("qwen3-coder", "detected in the chat template")


@pytest.mark.parametrize("order", [(HERMES, CODER), (CODER, HERMES)])
def test_detection_picks_the_most_specific_match_in_any_registration_order(order):
    formats = _registry(*order, ACME)
    assert _pick(formats, CODER_TEMPLATE) == ("qwen3-coder", "detected in the chat template")
    assert _pick(formats, HERMES_TEMPLATE) == ("hermes", "detected in the chat template")


def test_no_match_is_no_format():
    assert _pick(_registry(HERMES, CODER), PLAIN) == \
        (None, "no installed format matches the chat template")
    assert _pick(_registry(), HERMES_TEMPLATE)[0] is None


def test_a_template_that_renders_no_calls_gets_generic_json_when_installed():
    """The chat layer shows such a model its calls as llama-server's generic JSON, so that
    is what its answers are read as; a template that renders calls in an unknown markup
    gets no format."""
    generic = ToolFormat(name="generic_json", detect=lambda t: False,
                         parser="mlxcel.nowhere:new_parser")
    assert _pick(_registry(HERMES, generic), PLAIN) == \
        ("generic_json", "the chat template renders no tool calls: generic JSON")
    markup = ("{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
              "<<{{ c.function.name }} {{ c.function.arguments | tojson }}>>{% endfor %}"
              "{% endfor %}")
    assert _pick(_registry(HERMES, generic), markup)[0] is None
    assert _pick(_registry(HERMES), PLAIN)[0] is None


def test_a_tie_at_the_top_names_both_formats():
    formats = _registry(HERMES, ACME, ACME_TOO)
    with pytest.raises(StartupError) as err:
        _pick(formats, "<acme_call>")
    assert "'acme-xml'" in str(err.value) and "'acme-json'" in str(err.value)
    assert "--tool-call-format" in str(err.value)
    # a tie below the winner is no tie
    assert _pick(_registry(HERMES, _spec(ACME, 0), _spec(ACME_TOO, 0), _spec(CODER, 5)),
                 "<acme_call><function=")[0] == "qwen3-coder"
    # and the flag settles one
    assert _pick(formats, "<acme_call>", flag="acme-json")[0] == "acme-json"


def _spec(fmt: ToolFormat, specificity: int) -> ToolFormat:
    import msgspec

    return msgspec.structs.replace(fmt, specificity=specificity)


def test_an_unknown_flag_is_one_line_naming_the_flag_and_the_known_formats():
    with pytest.raises(StartupError) as err:
        _pick(_registry(HERMES, ACME), HERMES_TEMPLATE, flag="hermes2")
    message = str(err.value)
    assert message == ("--tool-call-format hermes2: no tool format named 'hermes2' "
                       "(known: acme-xml, hermes)")


def _only_core(*formats: ToolFormat):
    """The builtin family and dialects, and just ``formats`` as the installed tool formats
    (whatever else this environment has installed)."""
    from mlxcel.plugins import load_plugins

    plugins = load_plugins("family-text,dialect-openai,dialect-llamacpp")
    for fmt in formats:
        plugins.tool_formats.add(fmt)
    return plugins


def test_the_loaded_checkpoint_keeps_the_choice_and_logs_it_once(tiny_checkpoint):
    from structlog.testing import capture_logs

    plugins = _only_core(HERMES, ACME)
    with capture_logs() as logs:
        ckpt = load_checkpoint(str(tiny_checkpoint), plugins.families,
                               tool_formats=plugins.tool_formats)
    assert "<tool_call>" in ckpt.template.source  # the tiny checkpoint's ChatML template
    assert (ckpt.tool_format, ckpt.tool_format_reason) == \
        (HERMES, "detected in the chat template")
    picked = [e for e in logs if e["event"] == "tool_format_selected"]
    assert picked == [{"event": "tool_format_selected", "name": "hermes",
                       "why": "detected in the chat template", "log_level": "info"}]
    flagged = load_checkpoint(str(tiny_checkpoint), plugins.families,
                              tool_formats=plugins.tool_formats, tool_call_format="acme-xml")
    assert (flagged.tool_format, flagged.tool_format_reason) == (ACME, "--tool-call-format")
    with pytest.raises(StartupError, match="--tool-call-format nope"):
        load_checkpoint(str(tiny_checkpoint), plugins.families,
                        tool_formats=plugins.tool_formats, tool_call_format="nope")


@pytest.mark.parametrize("formats,flag,parser", [
    ((HERMES,), None, "mlxcel"),
    ((ACME,), None, None),  # the ChatML template shows no <acme_call>
    ((ACME,), "acme-xml", "mlxcel"),
])
def test_health_says_whether_the_model_has_a_tool_format(tiny_checkpoint, formats, flag,
                                                         parser):
    from apphelpers import wait_ready
    from litestar.testing import TestClient
    from mlxcel.app import create_app
    from mlxcel.settings import Settings

    settings = Settings(model=str(tiny_checkpoint), alias="tiny", parallel=1,
                        tool_call_format=flag)
    with TestClient(create_app(settings, plugins=_only_core(*formats))) as client:
        wait_ready(client)
        body = client.get("/health").json()
        assert body["status"] == "ok" and body["tool_call_parser"] == parser
        ckpt = client.app.state["ctx"].engine.checkpoint
        assert (ckpt.tool_format.name if ckpt.tool_format else None) == \
            (flag or (formats[0].name if parser else None))
