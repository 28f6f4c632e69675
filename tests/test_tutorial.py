"""The tutorial is true to its example package: every Python and TOML block is copied from
one of the package's files, its file tree is the package's, its sample output parses as it
says, and its commands name things that exist. (The `mlxcel-server plugins` listing it shows
is compared with the real one in ``test_third_party_plugin.py``, which installs the package.)
"""

from __future__ import annotations

import configparser
import importlib.util
import re
from pathlib import Path

from mlxcel.types.toolcalls import CallArguments, CallEnd, CallStart, ParsedCall, ToolText

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial" / "first-tool-format.md"
PACKAGE = ROOT / "docs" / "examples" / "toolcall-acme"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", TUTORIAL.read_text(), re.M | re.S)


def _package_files() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)}


def test_every_python_and_toml_block_is_copied_from_the_package():
    files = _package_files()
    blocks = _blocks("python") + _blocks("toml")
    assert len(blocks) >= 10, "the tutorial lost its code"
    for block in blocks:
        assert any(block in text for text in files.values()), \
            f"this block is in no file of {PACKAGE.name}:\n{block}"


def test_the_file_tree_is_the_package():
    tree = next(b for b in _blocks("text") if b.startswith("docs/examples/toolcall-acme/"))
    listed = {line.strip() for line in tree.splitlines()[1:] if line.strip()}
    assert listed == set(_package_files()), set(_package_files()) ^ listed


def test_the_sample_output_parses_as_the_tutorial_says():
    spec = importlib.util.spec_from_file_location(
        "acme_parser_for_the_tutorial", PACKAGE / "src" / "acme_mlxcel" / "parser.py")
    parser_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parser_module)
    sample = next(b for b in _blocks("text") if "<acme_call>" in b).strip()
    parser = parser_module.new_parser(())
    events = parser.feed(sample, ())
    result = parser.finish()
    assert [*events, *result.events] == [
        ToolText(text="Let me check. "), CallStart(index=0, name="get_weather"),
        CallArguments(index=0, text='{"city": "Paris"}'), CallEnd(index=0)]
    assert result.calls == (ParsedCall(name="get_weather", arguments='{"city": "Paris"}'),)


def test_the_commands_name_real_paths_and_tox_envs():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    commands = [line for b in _blocks("sh") for line in b.splitlines() if line.strip()]
    assert commands
    for line in commands:
        for path in re.findall(r"(?:^|\s)(\./\S+|docs/\S+|templates/\S+)", line):
            assert (ROOT / path).exists(), f"{line!r} names {path}, which does not exist"
        for env in re.findall(r"tox -e (\S+)", line):
            assert f"testenv:{env}" in tox, f"{line!r} names tox env {env}, which tox.ini lacks"
    for page in re.findall(r"\]\((\.\./[^)#]+)\)", TUTORIAL.read_text()):
        assert (TUTORIAL.parent / page).exists(), f"the tutorial links to {page}, missing"
