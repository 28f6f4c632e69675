"""Unit tests of the plugin core: registries, tool-format selection, load_plugins()."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import mlxcel
import msgspec
import pytest
from mlxcel.dialects.api import Dialect
from mlxcel.errors import PluginError, StartupError
from mlxcel.families.api import Family
from mlxcel.families.registry import FamilyRegistry
from mlxcel.plugins import load_plugins
from mlxcel.registry import Registry
from mlxcel.testing.builtin_plugins import BUILTINS
from mlxcel.toolcalls.api import ToolFormat
from mlxcel.toolcalls.registry import ToolFormatRegistry


@pytest.fixture(autouse=True)
def _no_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLXCEL_PLUGINS", raising=False)
    monkeypatch.delenv("MLXCEL_DISABLE_PLUGINS", raising=False)


# --- Registry -----------------------------------------------------------------------------


class Widget(msgspec.Struct, frozen=True):
    name: str | None


def test_registry_refuses_duplicates_naming_both_owners() -> None:
    reg: Registry[Widget] = Registry("widget")
    reg.current_owner = "plugin-a"
    first = Widget("w")
    reg.add(first)
    reg.current_owner = "plugin-b"
    with pytest.raises(PluginError) as err:
        reg.add(Widget("w"))
    msg = str(err.value)
    assert "widget 'w'" in msg and "'plugin-a'" in msg and "'plugin-b'" in msg
    assert reg.get("w") is first and reg.owner("w") == "plugin-a"
    assert reg.keys_of("plugin-a") == ["w"] and reg.keys_of("plugin-b") == []


def test_registry_keys_items_by_their_own_name() -> None:
    reg: Registry[Widget] = Registry("widget")
    reg.current_owner = "plugin-a"
    for nameless in (Widget(""), Widget(None), 3):
        with pytest.raises(PluginError, match="plugin-a.*non-empty name"):
            reg.add(nameless)
    reg.add(Widget("b"))
    reg.add(Widget("a"))
    assert list(reg) == ["b", "a"] and len(reg) == 2 and "a" in reg
    assert reg.get("a").name == "a"
    with pytest.raises(KeyError, match=r"known: a, b"):
        reg.get("zzz")


# --- FamilyRegistry -----------------------------------------------------------------------


def _family(name: str, *model_types: str, **kw) -> Family:
    tasks = kw.pop("tasks", {"generate": f"pkg_{name}.loader:decoder"})
    return Family(name=name, model_types=model_types, load=f"pkg_{name}.loader:load",
                  tasks=tasks, **kw)


def test_family_registry_refuses_duplicate_model_type_naming_both() -> None:
    reg = FamilyRegistry()
    reg.current_owner = "family-alpha"
    reg.add(_family("alpha", "llama", "alpha_lm"))
    reg.current_owner = "family-beta"
    with pytest.raises(PluginError) as err:
        reg.add(_family("beta", "beta_lm", "llama"))
    msg = str(err.value)
    assert "'llama'" in msg
    assert "'alpha'" in msg and "'family-alpha'" in msg
    assert "'beta'" in msg and "'family-beta'" in msg
    # nothing of the refused family was registered, not even its other model_types
    assert "beta" not in reg and reg.for_model_type("beta_lm") is None
    assert reg.for_model_type("llama").name == "alpha"
    assert reg.for_model_type("alpha_lm").name == "alpha"
    assert reg.for_model_type("unknown") is None


def test_family_registry_refuses_duplicate_family_name() -> None:
    reg = FamilyRegistry()
    reg.current_owner = "family-one"
    reg.add(_family("same", "t1"))
    reg.current_owner = "family-two"
    with pytest.raises(PluginError, match="family-one.*family-two"):
        reg.add(_family("same", "t2"))


def test_family_registry_refuses_unknown_tasks_and_no_tasks() -> None:
    reg = FamilyRegistry()
    reg.current_owner = "family-odd"
    with pytest.raises(PluginError) as err:
        reg.add(_family("odd", "odd_lm", tasks={"generate": "a:b", "telepathy": "a:c"}))
    assert "telepathy" in str(err.value) and "family-odd" in str(err.value)
    with pytest.raises(PluginError, match="declares no tasks"):
        reg.add(_family("none", "none_lm", tasks={}))
    assert "odd" not in reg and reg.for_model_type("odd_lm") is None
    reg.add(_family("ok", "ok_lm", tasks={"embed": "a:b", "rerank": "a:c"}))
    assert reg.for_model_type("ok_lm") is None  # it does not generate
    assert reg.for_model_type("ok_lm", task="rerank").name == "ok"


def test_one_model_type_in_two_families_of_different_tasks() -> None:
    """A chat family and an embedder family may both list ``qwen3``: they serve
    different tasks, so neither shadows the other."""
    reg = FamilyRegistry()
    reg.add(_family("chat", "qwen3"))
    reg.add(_family("emb", "qwen3", tasks={"embed": "a:b"}))
    assert reg.for_model_type("qwen3").name == "chat"
    assert reg.for_model_type("qwen3", task="embed").name == "emb"
    with pytest.raises(PluginError, match="duplicate model_type 'qwen3'"):
        reg.add(_family("emb2", "qwen3", tasks={"embed": "a:b"}))


# --- ToolFormatRegistry.select --------------------------------------------------------------


@pytest.fixture
def formats() -> ToolFormatRegistry:
    reg = ToolFormatRegistry()
    reg.current_owner = "toolcall-test"
    for name, marker in (("alpha", "<alpha>"), ("beta", "<beta>"), ("gamma", "<gamma>")):
        reg.add(ToolFormat(
                name=name, detect=lambda t, m=marker: m in t, parser=f"pkg_{name}:new_parser"
            ),
        )
    return reg


def test_select_flag_beats_family_default_and_detection(formats) -> None:
    template = "<alpha> <beta>"  # ambiguous on its own
    assert formats.select(template, flag="gamma", family_default="beta").name == "gamma"
    assert formats.select(None, flag="gamma").name == "gamma"


def test_select_family_default_beats_detection(formats) -> None:
    assert formats.select("<alpha>", family_default="beta").name == "beta"
    assert formats.select("<alpha> <beta>", family_default="gamma").name == "gamma"


def test_select_unregistered_family_default_falls_back_to_detection(formats) -> None:
    assert formats.select("<alpha>", family_default="not-installed").name == "alpha"


def test_select_unique_detection(formats) -> None:
    assert formats.select("{{ '<beta>' }}").name == "beta"
    assert formats.select("plain template") is None
    assert formats.select(None) is None
    assert formats.select("") is None


def test_select_two_detections_is_a_startup_error(formats) -> None:
    with pytest.raises(StartupError) as err:
        formats.select("<alpha> ... <gamma>")
    msg = str(err.value)
    assert "alpha" in msg and "gamma" in msg and "beta" not in msg
    assert "choose one" in msg


# --- load_plugins with the installed builtins ----------------------------------------------


def _by_name(plugins) -> dict:
    return {i.name: i for i in plugins.infos}


def test_load_plugins_finds_the_builtins() -> None:
    plugins = load_plugins()
    infos = _by_name(plugins)
    for name, module in BUILTINS.items():
        info = infos[name]
        assert info.status == "loaded" and info.error is None
        assert info.module == module
        assert info.distribution == "mlxcel" and info.version == mlxcel.__version__
    assert infos["family-text"].registers == {"families": ["mlx-lm-text", "mlx-lm-generic"]}
    assert infos["dialect-openai"].registers == {"dialects": ["openai"]}
    assert infos["dialect-llamacpp"].registers == {"dialects": ["llamacpp"]}
    assert plugins.families.owner("mlx-lm-text") == "family-text"
    assert plugins.families.for_model_type("llama").name == "mlx-lm-text"
    assert plugins.families.owner("mlx-lm-generic") == "family-text"
    assert plugins.dialects.owner("openai") == "dialect-openai"
    assert plugins.dialects.get("llamacpp").routes == "mlxcel.dialects.llamacpp.routes:build"
    assert "hermes" in infos["toolcall-builtin"].registers["tool formats"]
    assert plugins.tool_formats.owner("hermes") == "toolcall-builtin"


@pytest.mark.parametrize("deny", ["dialect-openai", " dialect-openai , ", ["dialect-openai"]])
def test_deny_list_disables_a_plugin(deny) -> None:
    plugins = load_plugins(deny=deny)
    infos = _by_name(plugins)
    assert infos["dialect-openai"].status == "disabled"
    assert infos["dialect-openai"].registers == {}
    assert "openai" not in plugins.dialects
    assert "llamacpp" in plugins.dialects and "mlx-lm-text" in plugins.families


def test_allow_list_loads_only_named_plugins() -> None:
    plugins = load_plugins(allow="family-text,dialect-llamacpp")
    infos = _by_name(plugins)
    loaded = sorted(n for n, i in infos.items() if i.status == "loaded")
    assert loaded == ["dialect-llamacpp", "family-text"]
    assert {i.status for n, i in infos.items() if n not in loaded} <= {"disabled"}
    assert list(plugins.dialects) == ["llamacpp"]
    assert list(plugins.families) == ["mlx-lm-text", "mlx-lm-generic"]


def test_deny_list_wins_over_allow_list() -> None:
    plugins = load_plugins(allow="family-text,dialect-openai", deny="dialect-openai")
    infos = _by_name(plugins)
    assert infos["dialect-openai"].status == "disabled"
    assert infos["family-text"].status == "loaded"
    assert len(plugins.dialects) == 0


def test_unknown_name_in_allow_list_lists_installed_plugins() -> None:
    with pytest.raises(StartupError) as err:
        load_plugins(allow="family-text,family-nope")
    msg = str(err.value)
    assert "family-nope" in msg
    for name in BUILTINS:
        assert name in msg


# --- load_plugins with throwaway installed distributions (dist-info on sys.path) ----------


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make a distribution with one ``mlxcel`` entry point importable from tmp_path."""
    packages: list[str] = []

    def install(dist: str, ep_name: str, package: str, source: str) -> None:
        site = tmp_path / "site"
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-0.4.2.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.4.2\n")
        (info / "entry_points.txt").write_text(f"[mlxcel]\n{ep_name} = {package}\n")
        packages.append(package)

    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield install
    for package in packages:
        sys.modules.pop(package, None)


def test_failed_plugin_is_reported_and_others_load(install_plugin) -> None:
    install_plugin(
        "unit-broken", "toolcall-unitbroken", "unit_broken_pkg", "raise ImportError('needs libfoo')"
    )
    plugins = load_plugins()
    infos = _by_name(plugins)
    broken = infos["toolcall-unitbroken"]
    assert broken.status == "failed"
    assert broken.error == "ImportError: needs libfoo"
    assert (broken.distribution, broken.version) == ("unit-broken", "0.4.2")
    assert all(infos[n].status == "loaded" for n in BUILTINS)
    assert "mlx-lm-text" in plugins.families


def test_failed_plugin_named_in_allow_list_is_a_startup_error(install_plugin) -> None:
    install_plugin(
        "unit-broken", "toolcall-unitbroken", "unit_broken_pkg", "raise ImportError('needs libfoo')"
    )
    with pytest.raises(StartupError) as err:
        load_plugins(allow="family-text,toolcall-unitbroken")
    msg = str(err.value)
    assert "toolcall-unitbroken" in msg and "unit-broken" in msg and "needs libfoo" in msg


def test_plugin_duplicating_a_builtin_key_names_both(install_plugin) -> None:
    install_plugin("unit-dialect", "dialect-unitdup", "unit_dup_pkg", """
        from mlxcel.dialects.kit import Dialect, register

        mlxcel_register_dialects = register(Dialect(name="openai", routes="x:y"))
    """)
    with pytest.raises(PluginError) as err:
        load_plugins()
    assert "dialect-openai" in str(err.value) and "dialect-unitdup" in str(err.value)
    # the offender disabled: the builtin wins again
    plugins = load_plugins(deny="dialect-unitdup")
    assert plugins.dialects.owner("openai") == "dialect-openai"


def test_hook_raising_is_a_plugin_error_naming_plugin_and_hook(install_plugin) -> None:
    install_plugin("unit-raiser", "family-unitraiser", "unit_raiser_pkg", """
        from mlxcel import hookimpl

        @hookimpl
        def mlxcel_register_families(registry):
            raise RuntimeError("boom")
    """)
    with pytest.raises(PluginError) as err:
        load_plugins()
    msg = str(err.value)
    assert "family-unitraiser" in msg and "mlxcel_register_families" in msg and "boom" in msg


def test_registrations_are_recorded_per_plugin(install_plugin) -> None:
    install_plugin("unit-multi", "family-unitmulti", "unit_multi_pkg", """
        from mlxcel.families.api import Family
        from mlxcel import hookimpl
        from mlxcel.media.api import MediaDecoder
        from mlxcel.toolcalls.api import ToolFormat

        @hookimpl
        def mlxcel_register_media_decoders(registry):
            registry.add(MediaDecoder(name="unit-png", kind="image",
                                      mimes={"image/x-unit": b"UNIT"},
                                      decode="unit_multi_pkg.heavy:decode"))

        @hookimpl
        def mlxcel_register_families(registry):
            registry.add(Family(name="unit-fam", model_types=("unit_lm",),
                                load="unit_multi_pkg.heavy:load",
                                tasks={"generate": "unit_multi_pkg.heavy:decoder"}))

        @hookimpl
        def mlxcel_register_tool_formats(registry):
            registry.add(ToolFormat(name="unit-fmt", detect=lambda t: False,
                                                     parser="unit_multi_pkg.heavy:new_parser"))
    """)
    plugins = load_plugins()
    info = _by_name(plugins)["family-unitmulti"]
    assert info.registers == {"families": ["unit-fam"], "tool formats": ["unit-fmt"],
                              "media decoders": ["unit-png"]}
    assert plugins.media_decoders.for_kind("image")[0].name == "unit-png"
    assert plugins.families.for_model_type("unit_lm").name == "unit-fam"
    assert plugins.tool_formats.owner("unit-fmt") == "family-unitmulti"


def test_misspelled_hook_is_reported_as_a_plugin_problem(install_plugin) -> None:
    install_plugin("unit-typo", "family-unittypo", "unit_typo_pkg", """
        from mlxcel import hookimpl

        @hookimpl
        def mlxcel_register_familes(registry):
            pass
    """)
    try:
        plugins = load_plugins()
    except (PluginError, StartupError) as exc:
        assert "family-unittypo" in str(exc)
    else:
        assert _by_name(plugins)["family-unittypo"].status == "failed"


def test_empty_plugins_env_means_no_allow_list(monkeypatch, capsys) -> None:
    import json

    from mlxcel.cli import main

    # `mlxcel-server plugins` must read an empty variable as unset, like the server does
    monkeypatch.setenv("MLXCEL_PLUGINS", "")
    monkeypatch.setenv("MLXCEL_DISABLE_PLUGINS", "")
    assert main(["plugins", "--json"]) == 0
    infos = {i["name"]: i for i in json.loads(capsys.readouterr().out)}
    assert all(infos[n]["status"] == "loaded" for n in BUILTINS)


def test_dialect_struct_defaults() -> None:
    d = Dialect(name="x", routes="pkg.routes:build")
    assert d.description == ""
