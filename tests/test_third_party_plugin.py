"""A real third-party distribution, built and installed into a target dir, seen by the CLI.

Three distributions are built once per module (hatchling, via uv or pip):

* ``acme-mlxcel-plugin``: the tutorial's example package, ``docs/examples/toolcall-acme``
  (entry point ``toolcall-acme``: a tool format and a family), built from its source so
  the tutorial and this test share one copy;
* ``acme-llama-plugin`` (throwaway): entry point ``family-acme-llama``, claims model_type
  ``llama``, which the builtin ``family-text`` already owns;
* ``acme-broken-plugin`` (throwaway): entry point ``toolcall-broken``, whose module raises
  ImportError;
* ``acme-twin-plugin`` (throwaway): entry point ``toolcall-acme-twin``, a second format that
  detects ``<acme_call>`` as specifically as acme-xml does (a true tie).

Each is installed into its own ``--target`` dir, so a test picks the set it wants through
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BUILTINS = ("dialect-llamacpp", "dialect-openai", "family-text", "toolcall-builtin")
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "toolcall-acme"

LLAMA_PLUGIN = """
from mlxcel.families.api import Family
from mlxcel import hookimpl


@hookimpl
def mlxcel_register_families(registry):
    registry.add(Family(
        name="acme-llama", model_types=("llama",), load="acme_llama.loader:load",
        tasks={"generate": "acme_llama.loader:decoder"}))
"""

BROKEN_PLUGIN = """
raise ImportError("acme_broken needs libacme >= 9")
"""

TWIN_PLUGIN = """
from mlxcel import hookimpl
from mlxcel.toolcalls.api import ToolFormat


@hookimpl
def mlxcel_register_tool_formats(registry):
    registry.add(ToolFormat(name="acme-json", detect=lambda t: "<acme_call>" in t,
                            parser="acme_twin.parser:new_parser", specificity=20))
"""

ACME_TEMPLATE = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                 "{% if tools %}Call tools as <acme_call>{...}</acme_call>{% endif %}")


def _write_dist(root: Path, dist: str, package: str, ep_name: str, modules: dict[str, str]) -> Path:
    src = root / dist
    pkg = src / "src" / package
    pkg.mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "{dist}"
        version = "1.2.3"
        requires-python = ">=3.10"

        [project.entry-points.mlxcel]
        {ep_name} = "{package}.plugin"

        [tool.hatch.build.targets.wheel]
        packages = ["src/{package}"]
    """)
    )
    (pkg / "__init__.py").write_text("")
    for name, text in modules.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(text))
    return src


def _installer() -> list[str]:
    uv = Path(sys.executable).with_name("uv")
    uv_cmd = str(uv) if uv.exists() else shutil.which("uv")
    if uv_cmd:
        return [uv_cmd, "pip", "install", "--python", sys.executable]
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def _install(src: Path, target: Path) -> Path:
    cmd = [*_installer(), "--no-deps", "--target", str(target), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"could not install {src.name}:\n{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return target


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("third-party")
    # a copy, so the build never writes into (or races over) the source tree
    example = shutil.copytree(EXAMPLE, root / "toolcall-acme", ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", ".tox", "build", "dist"))
    srcs = {
        "acme": example,
        "llama": _write_dist(
            root, "acme-llama-plugin", "acme_llama", "family-acme-llama", {"plugin": LLAMA_PLUGIN}
        ),
        "broken": _write_dist(
            root, "acme-broken-plugin", "acme_broken", "toolcall-broken", {"plugin": BROKEN_PLUGIN}
        ),
        "twin": _write_dist(
            root, "acme-twin-plugin", "acme_twin", "toolcall-acme-twin", {"plugin": TWIN_PLUGIN}
        ),
    }
    return {key: _install(src, root / f"site-{key}") for key, src in srcs.items()}


def _env(site_dirs: list[Path], **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLXCEL_PLUGINS", "MLXCEL_DISABLE_PLUGINS")
    }
    paths = [str(p) for p in site_dirs]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def _cli(site_dirs: list[Path], *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlxcel.cli", "plugins", *args],
        capture_output=True,
        text=True,
        env=_env(site_dirs, **env),
        timeout=120,
    )


def _infos(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    # The JSON document is the last stdout line.
    return {i["name"]: i for i in json.loads(proc.stdout.strip().splitlines()[-1])}


def test_third_party_plugin_is_listed_with_its_registrations(sites) -> None:
    infos = _infos(_cli([sites["acme"]], "--json"))
    acme = infos["toolcall-acme"]
    assert acme["distribution"] == "acme-mlxcel-plugin"
    assert acme["version"] == "1.2.3"
    assert acme["module"] == "acme_mlxcel.plugin"
    assert acme["status"] == "loaded" and acme["error"] is None
    assert acme["registers"] == {"tool formats": ["acme-xml"], "families": ["acme"]}
    for name in BUILTINS:
        assert infos[name]["status"] == "loaded", infos[name]


def test_text_listing_shows_third_party_plugin(sites) -> None:
    proc = _cli([sites["acme"]])
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("toolcall-acme"))
    assert "acme-mlxcel-plugin 1.2.3" in line
    assert "tool formats: acme-xml" in line and "families: acme" in line


def test_the_docs_show_the_real_listing(sites) -> None:
    """The tutorial and the how-to print what ``mlxcel-server plugins`` prints with the
    example package installed, line for line."""
    proc = _cli([sites["acme"]])
    assert proc.returncode == 0, proc.stderr
    real = proc.stdout.splitlines()
    for page in ("tutorial/first-tool-format.md", "howto/selecting-plugins.md"):
        text = (EXAMPLE.parents[1] / page).read_text()
        shown = re.findall(r"^((?:dialect|family|toolcall)-[\w-]+  .+|tool formats.*"
                           r"|  [\w.-]+  specificity -?\d+  from .+)$", text, re.M)
        assert any(line.startswith("toolcall-acme") for line in shown), page
        for line in shown:
            assert line in real, f"{page} shows {line!r}; mlxcel-server plugins prints {real}"


def test_third_party_registrations_are_usable_and_lazy(sites) -> None:
    code = textwrap.dedent("""
        import json, pathlib, sys
        import msgspec
        from mlxcel.lazy import resolve
        from mlxcel.plugins import load_plugins

        p = load_plugins()
        eager = [m for m in ("acme_mlxcel.parser", "acme_mlxcel.loader") if m in sys.modules]
        family = p.families.select(pathlib.Path("."), {"model_type": "acme_lm"}, "generate")
        fmt = p.tool_formats.select("{% if tools %}<acme_call>{% endif %}")
        by_default = p.tool_formats.select(None, family_default=family.default_tool_format)
        parser = resolve(fmt.parser)(())
        events = parser.feed('Sure. <acme_call>{"name": "f", "arguments": {"x": 1}}', ())
        events += parser.feed("</acme_call>", ())
        result = parser.finish()
        print(json.dumps({
            "eager": eager, "family": family.name, "owner": p.families.owner("acme"),
            "fmt": fmt.name, "by_default": by_default.name,
            "events": msgspec.to_builtins([*events, *result.events]),
            "calls": msgspec.to_builtins(result.calls),
        }))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env([sites["acme"]]),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["eager"] == [], f"'module:attr' targets imported at registration: {out['eager']}"
    assert out["family"] == "acme" and out["owner"] == "toolcall-acme"
    assert out["fmt"] == "acme-xml" and out["by_default"] == "acme-xml"
    assert out["events"] == [
        {"type": "text", "text": "Sure. "},
        {"type": "call_start", "index": 0, "name": "f", "id": None},
        {"type": "call_arguments", "index": 0, "text": '{"x": 1}'},
        {"type": "call_end", "index": 0},
    ]
    assert out["calls"] == [{"name": "f", "arguments": '{"x": 1}', "id": None}]


def test_duplicate_model_type_fails_naming_both_owners(sites) -> None:
    proc = _cli([sites["llama"]], "--json")
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr
    assert "llama" in err
    assert "family-text" in err and "family-acme-llama" in err, err
    assert "Traceback" not in err, err
    # disabling the offender is the way out
    infos = _infos(_cli([sites["llama"]], "--json", "--disable-plugins", "family-acme-llama"))
    assert infos["family-acme-llama"]["status"] == "disabled"
    assert infos["family-text"]["status"] == "loaded"


def _flag_and_env(site: Path, flag: str, env: str, value: str) -> list[dict[str, dict]]:
    """The plugin listing with ``value`` given once as ``flag`` and once as ``env``."""
    return [_infos(_cli([site], "--json", flag, value)),
            _infos(_cli([site], "--json", **{env: value}))]


def test_disable_plugins_flag_and_env(sites) -> None:
    for infos in _flag_and_env(sites["acme"], "--disable-plugins", "MLXCEL_DISABLE_PLUGINS",
                               "toolcall-acme"):
        assert infos["toolcall-acme"]["status"] == "disabled"
        assert infos["toolcall-acme"]["registers"] == {}
        for name in BUILTINS:
            assert infos[name]["status"] == "loaded"


def test_allow_list_loads_only_the_named_plugin(sites) -> None:
    for infos in _flag_and_env(sites["acme"], "--plugins", "MLXCEL_PLUGINS", "dialect-openai"):
        assert infos["dialect-openai"]["status"] == "loaded"
        assert infos["dialect-openai"]["registers"] == {"dialects": ["openai"]}
        others = {n: i["status"] for n, i in infos.items() if n != "dialect-openai"}
        assert "toolcall-acme" in others
        assert set(others.values()) == {"disabled"}, others
        assert all(i["registers"] == {} for n, i in infos.items() if n != "dialect-openai")


def test_broken_plugin_is_reported_and_others_still_load(sites) -> None:
    infos = _infos(_cli([sites["acme"], sites["broken"]], "--json"))
    broken = infos["toolcall-broken"]
    assert broken["status"] == "failed"
    assert broken["distribution"] == "acme-broken-plugin"
    assert "ImportError" in broken["error"] and "libacme >= 9" in broken["error"]
    assert broken["registers"] == {}
    assert infos["toolcall-acme"]["status"] == "loaded"
    assert infos["toolcall-acme"]["registers"] == {
        "tool formats": ["acme-xml"],
        "families": ["acme"],
    }
    for name in BUILTINS:
        assert infos[name]["status"] == "loaded"

    text = _cli([sites["acme"], sites["broken"]])
    assert text.returncode == 0
    assert "toolcall-broken [failed]" in text.stdout and "libacme >= 9" in text.stdout


def test_json_output_is_pure_json_when_a_plugin_fails(sites) -> None:
    proc = _cli([sites["acme"], sites["broken"]], "--json")
    assert proc.returncode == 0, proc.stderr
    infos = json.loads(proc.stdout)
    assert infos and all("name" in i for i in infos)


def test_broken_plugin_named_in_allow_list_fails_startup(sites) -> None:
    proc = _cli(
        [sites["acme"], sites["broken"]], "--json", "--plugins", "toolcall-acme,toolcall-broken"
    )
    assert proc.returncode != 0, proc.stdout
    assert "toolcall-broken" in proc.stderr and "acme-broken-plugin" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_allow_list_naming_an_uninstalled_plugin_fails(sites) -> None:
    proc = _cli([sites["acme"]], "--json", "--plugins", "toolcall-nope")
    assert proc.returncode != 0
    assert "toolcall-nope" in proc.stderr and "toolcall-acme" in proc.stderr


def test_model_needing_a_family_that_failed_to_import_says_what_to_install(
        sites, tiny_checkpoint, tmp_path) -> None:
    import shutil

    model = tmp_path / "acme-model"
    shutil.copytree(tiny_checkpoint, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "model_type": "broken_lm"}))
    proc = subprocess.run([sys.executable, "-m", "mlxcel.cli", "--model", str(model)],
                          capture_output=True, text=True, env=_env([sites["broken"]]),
                          timeout=120)
    assert proc.returncode != 0
    assert "broken_lm" in proc.stderr and "toolcall-broken" in proc.stderr
    assert "pip install --force-reinstall acme-broken-plugin" in proc.stderr
    assert "Traceback" not in proc.stderr


def _picked(proc: subprocess.CompletedProcess) -> str:
    """What ``mlxcel-server plugins --model M`` says M gets: its tool-format line (the one
    before its template's caps), after the path."""
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    *_, picked, caps = proc.stdout.strip().splitlines()
    assert caps.startswith("chat template caps for ")
    return picked.split(": ", 1)[1]


def _acme_model(checkpoint: Path, dest: Path) -> Path:
    """The tiny Llama checkpoint under acme's own model_type (family acme)."""
    shutil.copytree(checkpoint, dest)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, "model_type": "acme_lm"}))
    return dest


def test_the_acme_format_is_picked_by_flag_family_default_or_template(
        sites, tiny_checkpoint, tiny_llama_checkpoint, tmp_path) -> None:
    template = tmp_path / "acme.jinja"
    template.write_text(ACME_TEMPLATE)
    model = str(tiny_checkpoint)
    assert _picked(_cli([sites["acme"]], "--model", model, "--tool-call-format", "acme-xml")) \
        == "acme-xml (--tool-call-format; family mlx-lm-text)"
    assert _picked(_cli([sites["acme"]], "--model", model, "--chat-template-file",
                        str(template))) == "acme-xml (detected in the chat template; " \
                                           "family mlx-lm-text)"
    acme = _acme_model(tiny_llama_checkpoint, tmp_path / "acme-model")
    assert _picked(_cli([sites["acme"]], "--model", str(acme))) == \
        "acme-xml (the model family's default; family acme)"
    listing = _cli([sites["acme"]]).stdout.splitlines()
    assert "  acme-xml  specificity 20  from toolcall-acme" in listing


def test_a_tie_between_two_plugins_fails_naming_both_and_the_flag_settles_it(
        sites, tiny_checkpoint, tmp_path) -> None:
    template = tmp_path / "acme.jinja"
    template.write_text(ACME_TEMPLATE)
    args = ["--model", str(tiny_checkpoint), "--chat-template-file", str(template)]
    proc = _cli([sites["acme"], sites["twin"]], *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "'acme-xml'" in proc.stderr and "'acme-json'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert _picked(_cli([sites["acme"], sites["twin"]], *args, "--tool-call-format",
                        "acme-json")).startswith("acme-json (--tool-call-format")
    server = subprocess.run([sys.executable, "-m", "mlxcel.cli", *args], capture_output=True,
                            text=True, env=_env([sites["acme"], sites["twin"]]), timeout=120)
    assert server.returncode == 2 and "'acme-json'" in server.stderr, server.stderr


def test_the_server_selects_the_acme_format_through_the_flag(sites, tiny_checkpoint) -> None:
    import httpx
    from mlxcel.testing.servers import MlxcelServer

    srv = MlxcelServer(["--model", str(tiny_checkpoint), "--tool-call-format", "acme-xml",
                        "--log-format", "json"], env=_env([sites["acme"]]))
    try:
        assert httpx.get(srv.base_url + "/health").json()["tool_call_parser"] == "mlxcel"
        records = [json.loads(ln) for ln in srv.log().splitlines() if ln.startswith("{")]
        picked = [r for r in records if r.get("event") == "tool_format_selected"]
        assert [(r["name"], r["why"]) for r in picked] == [("acme-xml", "--tool-call-format")]
    finally:
        srv.stop()
