"""A llama-server command line carries over to mlxcel-server: every llama-server flag of the
options table is accepted and takes effect (or is named, with its reason, in the one
``flags_ignored`` startup line), a flag that is in no row is still an error, and
docs/reference/flags.md says what each one does here.

``python tests/test_llama_flags.py`` rewrites flags.md's table of ignored flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from mlxcel.engine.config import EngineConfig
from mlxcel.options import IGNORED, OPTIONS, build_parser, canonical, ignored_notes
from mlxcel.settings import Settings
from mlxcel.testing.e2e import GeneratedBlock
from mlxcel.testing.servers import MlxcelServer, server_exe

ROOT = Path(__file__).resolve().parents[1]
FLAGS_MD = ROOT / "docs" / "reference" / "flags.md"
_BEGIN = ("<!-- ignored flags: generated from mlxcel.options.OPTIONS by "
          "`python tests/test_llama_flags.py` -->")
_END = "<!-- end ignored flags -->"
LLAMA_ROWS = [row for row in OPTIONS if row.llama is not None]

# (command line, Settings field, the value it must hold): every spelling of every kept,
# mapped and pending llama-server flag (test_every_llama_server_spelling_is_exercised)
CASES = [
    (["--draft-max", "8"], "draft_max", 8), (["--draft", "8"], "draft_max", 8),
    (["--draft-n", "8"], "draft_max", 8), (["--spec-draft-n-max", "8"], "draft_max", 8),
    (["--draft-min", "2"], "draft_min", 2), (["--spec-draft-n-min", "2"], "draft_min", 2),
    (["-md", "d"], "model_draft", "d"), (["--model-draft", "d"], "model_draft", "d"),
    (["--draft-model", "d"], "model_draft", "d"), (["--spec-draft-model", "d"], "model_draft", "d"),
    (["--draft-kind", "mtp"], "draft_kind", "mtp"),
    (["--draft-block-size", "4"], "draft_block_size", 4),
    (["--spec-type", "draft-mtp"], "spec_type", "draft-mtp"),
    (["-m", "m"], "model", "m"), (["--model", "m"], "model", "m"),
    (["-a", "one,two"], "alias", "one,two"), (["--alias", "x"], "alias", "x"),
    (["--host", "0.0.0.0"], "host", "0.0.0.0"), (["--port", "9001"], "port", 9001),
    (["--api-key", "k1,k2"], "api_key", "k1,k2"),
    (["--api-key-file", "/keys"], "api_key_file", "/keys"),
    (["--reasoning-format", "none"], "reasoning_format", "none"),
    (["--reasoning-budget", "128"], "reasoning_budget", 128),
    (["--cors-origins", "*"], "cors_origins", "*"),
    (["--cors-methods", "GET"], "cors_methods", "GET"),
    (["--cors-headers", "X-A"], "cors_headers", "X-A"),
    (["--no-cors-credentials"], "cors_credentials", False),
    (["--no-cors-credentials", "--cors-credentials"], "cors_credentials", True),
    (["--threads-http", "3"], "threads_http", 3),
    (["-to", "5"], "timeout", 5.0), (["--timeout", "5"], "timeout", 5.0),
    (["-c", "1024"], "ctx_size", 1024), (["--ctx-size", "1024"], "ctx_size", 1024),
    (["-np", "2"], "parallel", 2), (["--parallel", "-1"], "parallel", 4),
    (["-n", "7"], "n_predict", 7), (["--predict", "7"], "n_predict", 7),
    (["--n-predict", "7"], "n_predict", 7),
    (["--chat-template-file", "/t.jinja"], "chat_template_file", "/t.jinja"),
    (["--chat-template", "llama3"], "chat_template", "llama3"),
    (["--no-jinja"], "jinja", False), (["--no-jinja", "--jinja"], "jinja", True),
    (["--chat-template-kwargs", '{"a": 1}'], "chat_template_kwargs", {"a": 1}),
    (["-ub", "64"], "prefill_chunk_size", 64), (["--ubatch-size", "64"], "prefill_chunk_size", 64),
    (["--prefill-chunk-size", "64"], "prefill_chunk_size", 64),
    (["-b", "256"], "batch_size", 256), (["--batch-size", "256"], "batch_size", 256),
    (["--slots"], "slots", True), (["--slots", "--no-slots"], "slots", False),
    (["--metrics"], "metrics", True),
    (["--no-cache-prompt"], "no_cache_prompt", True),
    (["--no-cache-prompt", "--cache-prompt"], "no_cache_prompt", False),
    (["-cram", "64"], "cache_ram", 64), (["--cache-ram", "64"], "cache_ram", 64),
    (["--ctx-checkpoints", "3"], "ctx_checkpoints", 3),
    (["--swa-checkpoints", "3"], "ctx_checkpoints", 3),
    (["--temp", "0.5"], "temp", 0.5), (["--temperature", "0.5"], "temp", 0.5),
    (["--top-k", "5"], "top_k", 5), (["--top-p", "0.5"], "top_p", 0.5),
    (["--min-p", "0.1"], "min_p", 0.1), (["--repeat-penalty", "1.1"], "repeat_penalty", 1.1),
    (["--repeat-last-n", "32"], "repeat_last_n", 32),
    (["--presence-penalty", "0.2"], "presence_penalty", 0.2),
    (["--frequency-penalty", "0.2"], "frequency_penalty", 0.2),
    (["--dry-multiplier", "0.8"], "dry_multiplier", 0.8), (["--dry-base", "2"], "dry_base", 2.0),
    (["--dry-allowed-length", "3"], "dry_allowed_length", 3),
    (["--dry-penalty-last-n", "16"], "dry_penalty_last_n", 16),
    (["--xtc-probability", "0.5"], "xtc_probability", 0.5),
    (["--xtc-threshold", "0.2"], "xtc_threshold", 0.2),
    (["-s", "3"], "seed", 3), (["--seed", "3"], "seed", 3),
    (["--embedding"], "embeddings", True), (["--embeddings"], "embeddings", True),
    (["--rerank"], "reranking", True), (["--reranking"], "reranking", True),
    (["--pooling", "mean"], "pooling", "mean"), (["--embd-normalize", "1"], "embd_normalize", 1),
    (["--tags", "a,b"], "tags", "a,b"), (["-rea", "off"], "reasoning", "off"),
    (["--reasoning", "on"], "reasoning", "on"), (["-v"], "verbose", True),
    (["--verbose"], "verbose", True), (["--log-verbose"], "verbose", True),
    (["--reasoning-effort", "high"], "reasoning_effort", "high"),
    (["-ctxcp", "3"], "ctx_checkpoints", 3),
]
SAMPLE = {"text": "1", "maybe_text": "on", "cache_type": "q8_0"}  # a value for ignored rows


@pytest.fixture(autouse=True)
def no_twins(monkeypatch):
    for row in OPTIONS:
        if row.env:
            monkeypatch.delenv(row.env, raising=False)


def settings(argv: list[str]) -> Settings:
    return Settings(**vars(build_parser().parse_args(argv)))


def test_every_llama_server_spelling_is_exercised():
    covered = {arg for argv, _, _ in CASES for arg in argv if arg.startswith("-")}
    for row in LLAMA_ROWS:
        if row.llama != IGNORED:
            assert set(row.flags) <= covered, row.flags


@pytest.mark.parametrize("argv,field,value", CASES, ids=lambda c: str(c))
def test_a_llama_server_flag_sets_its_setting(argv, field, value):
    """(A case whose value is the default gives the opposite spelling first.)"""
    assert getattr(settings(argv), field) == value
    assert settings(argv).ignored_flags == {}


@pytest.mark.parametrize("argv,field,value", [c for c in CASES if len(c[0]) == 2
                                              and not c[0][1].startswith("-")])
def test_its_llama_arg_twin_sets_the_same(monkeypatch, argv, field, value):
    row = next(r for r in OPTIONS if argv[0] in r.flags)
    monkeypatch.setenv(row.env, argv[1])
    assert getattr(settings([]), field) == value


@pytest.mark.parametrize("env,field,value", [
    ("LLAMA_ARG_JINJA", "jinja", False), ("LLAMA_ARG_ENDPOINT_SLOTS", "slots", True),
    ("LLAMA_ARG_EMBEDDINGS", "embeddings", True), ("LLAMA_ARG_CORS_CREDENTIALS",
                                                   "cors_credentials", False)])
def test_a_switchs_twin_takes_llama_servers_words(monkeypatch, env, field, value):
    monkeypatch.setenv(env, "enabled" if value else "disabled")
    assert getattr(settings([]), field) is value


IGNORED_CASES = [(row, flag) for row in OPTIONS if row.llama == IGNORED for flag in row.flags]


@pytest.mark.parametrize("row,flag", IGNORED_CASES, ids=[f for _, f in IGNORED_CASES])
def test_an_ignored_flag_is_accepted_and_named_with_its_reason(row, flag):
    takes = getattr(row.type, "__name__", "") in SAMPLE
    argv = [flag, SAMPLE[row.type.__name__]] if takes else [flag]
    got = settings(argv)
    assert got.ignored_flags == {canonical(row.flags): " ".join(argv)}
    assert ignored_notes(got) == [f"{' '.join(argv)}: {row.help}"]
    assert got == Settings(ignored_flags=got.ignored_flags)  # nothing else changed


def test_ignored_twins_are_named_and_a_bad_value_still_refuses(monkeypatch):
    from mlxcel.errors import StartupError

    monkeypatch.setenv("LLAMA_ARG_N_GPU_LAYERS", "99")
    got = settings(["-fa", "on", "-t", "8"])
    assert got.ignored_flags == {"--n-gpu-layers": "LLAMA_ARG_N_GPU_LAYERS=99",
                                 "--flash-attn": "-fa on", "--threads": "-t 8"}
    assert len(ignored_notes(got)) == 3
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q9_9")
    with pytest.raises(StartupError, match="LLAMA_ARG_CACHE_TYPE_K"):
        build_parser()
    monkeypatch.delenv("LLAMA_ARG_CACHE_TYPE_K")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-ctv", "q9_9"])


def test_side_model_flags_are_kept_not_named_as_ignored():
    notes = ignored_notes(settings(["--embeddings", "--pooling", "cls", "-ngl", "1"]))
    assert [n.split(":")[0] for n in notes] == ["-ngl 1"]


@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--mirostat", "2"], ["--ctx", "64"],
                                  ["--lora", "x"], ["-ngl"]])
def test_an_unknown_abbreviated_or_valueless_flag_is_an_error(argv):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2


def test_batch_sizes_map_onto_the_engine():
    """-ub is the chunk, clamped to -b; -b caps the burst budget (worker.burst_chunks)."""
    assert settings(["-ub", "256", "-b", "128"]).prefill_chunk() == 128
    assert settings(["-ub", "256"]).prefill_chunk() == 256
    assert settings(["-b", "2048"]).prefill_chunk() == 512
    assert EngineConfig.from_settings(settings(["-b", "1024"])).batch_size == 1024


@pytest.mark.parametrize("batch,chunks", [(None, 8), (4096, 8), (1024, 2), (100, 1)])
def test_batch_size_caps_the_burst_budget(tiny_checkpoint, batch, chunks):
    from mlxcel.testing.engine import worker_for

    worker = worker_for(tiny_checkpoint, chunk=512, config=EngineConfig(batch_size=batch),
                        burst_chunks=8)
    assert worker.burst_chunks == chunks


def test_threads_http_sets_granians_runtime_threads():
    from mlxcel.serving import granian_options

    assert granian_options(settings(["--threads-http", "3"]))["runtime_threads"] == 3
    assert granian_options(settings([]))["runtime_threads"] == 1


# -- the effects, in-process ----------------------------------------------------------------


def wait_ready(client) -> None:
    deadline = time.time() + 60
    while client.get("/health").status_code == 503:
        assert time.time() < deadline, "model did not load"
        time.sleep(0.05)


def test_a_llama_server_command_line_takes_effect_in_the_app(tiny_checkpoint):
    from litestar.testing import TestClient
    from mlxcel.app import create_app
    from mlxcel.cli import check_limits

    got = settings(["-m", str(tiny_checkpoint), "-a", "one,two", "-np", "2", "-c", "600",
                    "-n", "3", "--temp", "0.25", "-s", "7", "--slots", "--metrics",
                    "-ub", "64", "-b", "128", "--api-key", "k1,k2", "--chat-template",
                    "llama3", "-cram", "8", "-ngl", "99"])
    check_limits(got)
    with TestClient(create_app(got), raise_server_exceptions=False) as c:
        wait_ready(c)
        auth = {"Authorization": "Bearer k2"}
        assert c.get("/v1/models").status_code == 401
        assert [m["id"] for m in c.get("/v1/models", headers=auth).json()["data"]] == \
            ["one", "two"]
        health = c.get("/health").json()
        assert health["batch"]["max_batch_size"] == 2 and health["context_size"] == 300
        props = c.get("/props", headers={"Authorization": "Bearer k1"}).json()
        assert props["model_alias"] == "one" and "<|start_header_id|>" in props["chat_template"]
        gen = props["default_generation_settings"]
        assert gen["n_predict"] == 3 and gen["temperature"] == 0.25 and gen["seed"] == 7
        assert c.get("/slots", headers=auth).status_code == 200
        assert c.get("/metrics", headers=auth).status_code == 200
        engine = c.app.state["ctx"].engine
        assert engine.worker.prefill_chunk == 64 and engine.prompt_cache.capacity_bytes == 8 << 20
        r = c.post("/v1/chat/completions", headers=auth, json={
            "model": "two", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "two"


def test_no_slots_unmounts_slots_and_says_which_flag_mounts_it(tiny_checkpoint):
    from litestar.testing import TestClient
    from mlxcel.app import create_app

    got = settings(["-m", str(tiny_checkpoint), "--slots", "--no-slots"])
    with TestClient(create_app(got), raise_server_exceptions=False) as c:
        off = c.get("/slots")
        assert off.status_code == 501 and "--slots" in off.json()["error"]["message"]


# -- through the real mlxcel-server process -------------------------------------------------


def run_cli(*args, env=None):
    return subprocess.run([server_exe(), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag", ["--no-such-flag", "--mirostat", "--ctx"])
def test_the_server_refuses_an_unknown_flag_with_status_2(flag):
    proc = run_cli("--model", "/unused", flag, "1")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_server_refuses_an_unknown_template_name_listing_the_known_ones():
    proc = run_cli("--model", "/unused", "--chat-template", "llama9")
    assert proc.returncode == 2 and "llama9" in proc.stderr and "chatml" in proc.stderr


@pytest.mark.slow
def test_a_llama_server_command_line_serves_and_logs_one_ignored_line(tiny_checkpoint):
    srv = MlxcelServer(["-m", str(tiny_checkpoint), "-a", "one,two", "-np", "2", "-c", "512",
                        "-ngl", "99", "-fa", "on", "-t", "4", "--mlock", "--no-mmap",
                        "-ctk", "q8_0", "-ctv", "q8_0", "-nocb", "--jinja",
                        "--chat-template", "chatml", "-ub", "64", "-b", "256",
                        "--threads-http", "2", "--log-format", "json"],
                       env={"LLAMA_ARG_THREADS_BATCH": "4"})
    try:
        records = [json.loads(ln) for ln in srv.log().splitlines() if ln.startswith("{")]
        ignored = [r for r in records if r.get("event") == "flags_ignored"]
        assert len(ignored) == 1
        shown = [note.split(": ")[0] for note in ignored[0]["flags"]]
        assert shown == ["-ngl 99", "-t 4", "LLAMA_ARG_THREADS_BATCH=4", "--mlock",
                         "--no-mmap", "-fa on", "-ctk q8_0", "-ctv q8_0", "-nocb"]
        loaded = next(r for r in records if r.get("event") == "model_loaded")
        assert loaded["chat_template"] == "--chat-template chatml"
        models = httpx.get(srv.base_url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["one", "two"]
        health = httpx.get(srv.base_url + "/health").json()
        assert health["batch"]["max_batch_size"] == 2 and health["context_size"] == 256
        preflight = httpx.options(srv.base_url + "/v1/chat/completions", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    finally:
        srv.stop()


@pytest.mark.slow
def test_no_jinja_through_the_server_refuses_tools(tiny_checkpoint):
    srv = MlxcelServer(["-m", str(tiny_checkpoint), "--no-jinja"])
    try:
        r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
        assert r.status_code == 400 and "--no-jinja" in r.json()["error"]["message"]
    finally:
        srv.stop()


# -- docs -----------------------------------------------------------------------------------


def ignored_table() -> str:
    rows = [f"| {', '.join(f'`{f}`' for f in row.flags)} | "
            f"{f'`{row.env}`' if row.env else '—'} | {row.help} |"
            for row in OPTIONS if row.llama == IGNORED]
    return "\n".join(["| flag | env twin | why it changes nothing here |", "|---|---|---|", *rows])


IGNORED_TABLE = GeneratedBlock(FLAGS_MD, _BEGIN, _END, ignored_table,
                               "tests/test_llama_flags.py")


def test_flags_md_lists_every_ignored_flag_and_why():
    IGNORED_TABLE.check()


def test_flags_md_says_what_each_llama_server_flag_does_here():
    """The main table's llama-server column is the row's kind (— for mlxcel's own)."""
    lines = FLAGS_MD.read_text(encoding="utf-8").splitlines()
    for row in OPTIONS:
        if row.llama == IGNORED:
            continue
        cell = f"| {', '.join(f'`{f}`' for f in row.flags)} |"
        line = next((ln for ln in lines if ln.startswith(cell)), None)
        assert line is not None, cell
        assert line.split(" | ")[3] == (row.llama or "—"), row.flags


if __name__ == "__main__":
    IGNORED_TABLE.write()
