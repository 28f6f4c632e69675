"""llama-server's flags (issue #33): every flag of its README is a row of the options
table (kept, mapped, pending or ignored) or one flags.md names as refused, and the new
rows parse as llama-server parses them: ``--reasoning``, ``--reasoning-effort``,
``--tags``, ``--host`` lists, ``-v``, ``--image-model``."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest
from mlxcel.cli import check_limits
from mlxcel.errors import StartupError
from mlxcel.http_guard import HostPolicy
from mlxcel.listeners import bind, start_relays
from mlxcel.options import OPTIONS, build_parser
from mlxcel.serving import check_listens, granian_options
from mlxcel.settings import Settings

FLAGS_MD = Path(__file__).resolve().parents[2] / "docs" / "reference" / "flags.md"
# llama-server's speculative-decoding rows belong to the speculative-decoding options
SPECULATIVE = re.compile(r"^(--spec-|--draft|--no-spec-|-lcs$|-lcd$)")
# every flag of llama-server's README usage table (tools/server/README.md), one row a line
README_FLAGS = (Path(__file__).parent / "data" / "llama_server_readme_flags.txt"
                ).read_text(encoding="utf-8").splitlines()


@pytest.fixture(autouse=True)
def no_twins(monkeypatch):
    for row in OPTIONS:
        for env in (row.env, row.env_also):
            if env:
                monkeypatch.delenv(env, raising=False)


def parse(argv: list[str]) -> Settings:
    return Settings(**vars(build_parser().parse_args(argv)))


def refused_in_flags_md() -> set[str]:
    text = FLAGS_MD.read_text(encoding="utf-8").split("## llama-server flags refused")[1]
    table = text.split("Speculative decoding's flags")[0]
    return {f for line in table.splitlines() if line.startswith("| `")
            for f in re.findall(r"`(-[^`]+)`", line.split(" | ")[0])}


def test_every_readme_flag_is_a_row_or_named_as_refused():
    have = {flag for row in OPTIONS for flag in row.flags} | {"-h", "--help", "--version"}
    refused = refused_in_flags_md()
    for group in README_FLAGS:
        if any(SPECULATIVE.match(flag) for flag in group.split()):
            continue
        for flag in group.split():
            assert flag in have or flag in refused, flag
    assert not refused & have, refused & have


@pytest.mark.parametrize("flag", sorted(refused_in_flags_md()))
def test_a_refused_flag_refuses_to_start(flag):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([flag, "1"])
    assert info.value.code == 2


@pytest.mark.parametrize("value,mode", [("on", "on"), ("off", "off"), ("auto", "auto"),
                                        ("enabled", "on"), ("0", "off"), ("-1", "auto")])
def test_reasoning_takes_llama_servers_words(value, mode):
    got = parse(["--reasoning", value])
    assert got.reasoning == mode
    expected = None if mode == "auto" else {"enable_thinking": mode == "on"}
    assert got.chat_template_kwargs == expected


def test_reasoning_env_twin_and_its_conflict(monkeypatch, capsys):
    monkeypatch.setenv("LLAMA_ARG_REASONING", "off")
    assert parse([]).chat_template_kwargs == {"enable_thinking": False}
    assert parse(["--chat-template-kwargs", '{"a": 1}']).chat_template_kwargs == \
        {"a": 1, "enable_thinking": False}
    with pytest.raises(SystemExit):
        parse(["--chat-template-kwargs", '{"enable_thinking": true}'])
    assert "contradicts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--reasoning", "maybe"])


def test_reasoning_effort_is_a_template_variable(monkeypatch):
    assert parse([]).chat_template_kwargs is None
    assert parse(["--reasoning-effort", "high"]).chat_template_kwargs == \
        {"reasoning_effort": "high"}
    monkeypatch.setenv("LLAMA_ARG_REASONING_EFFORT", "low")
    assert parse(["-rea", "on"]).chat_template_kwargs == \
        {"enable_thinking": True, "reasoning_effort": "low"}
    with pytest.raises(SystemExit):
        parse(["--chat-template-kwargs", '{"reasoning_effort": "max"}'])


def test_tags_and_temperature_twins(monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_TAGS", "chat, fast ,")
    monkeypatch.setenv("LLAMA_ARG_TEMPERATURE", "0.3")
    got = parse([])
    assert got.tag_list() == ["chat", "fast"] and got.temp == 0.3
    assert parse(["--tags", "x"]).tag_list() == ["x"]


def test_verbose_has_no_env_twin_and_is_off_by_default():
    row = next(r for r in OPTIONS if "-v" in r.flags)
    assert row.env is None and row.dest == "verbose"
    assert not parse([]).verbose and parse(["--log-verbose"]).verbose


def test_image_model_refuses_to_start_and_its_twin_too(monkeypatch):
    with pytest.raises(StartupError, match="images API is not built yet"):
        check_limits(parse(["--image-model", "org/model"]))
    monkeypatch.setenv("MLXCEL_IMAGE_MODEL", "org/model")
    with pytest.raises(StartupError, match="MLXCEL_IMAGE_MODEL"):
        check_limits(parse([]))


def test_a_host_list_is_every_address_and_granian_takes_the_first():
    got = parse(["--host", "127.0.0.1, ::1"])
    assert got.hosts() == ("127.0.0.1", "::1")
    assert granian_options(got)["address"] == "127.0.0.1"
    assert HostPolicy.from_settings(got.host, None).names == {"localhost", "127.0.0.1", "::1"}
    assert HostPolicy.from_settings("127.0.0.1,0.0.0.0", None).names is None


def test_check_listens_resolves_each_address_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert check_listens(("127.0.0.1", "127.0.0.1"), port) == "127.0.0.1"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        with pytest.raises(StartupError, match="in use"):
            check_listens(("127.0.0.1",), port)
        with pytest.raises(StartupError, match="in use"):
            bind("127.0.0.1", port, 8)


def test_an_extra_address_is_relayed_byte_for_byte():
    """A bound extra socket relays to the first address (here an echo server that
    upper-cases), both ways, and closes when the far side does."""
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(1)

    def echo() -> None:
        conn, _ = upstream.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    extra = bind("127.0.0.1", 0, 8)
    port = extra.getsockname()[1]
    start_relays([extra], upstream.getsockname())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"hello relay")
        got = b""
        while len(got) < 11:
            got += client.recv(1024)
    assert got == b"HELLO RELAY"
    upstream.close()


