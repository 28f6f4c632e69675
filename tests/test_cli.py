"""The mlxcel-server command line: help, env twins, errors, plugins, demo mode."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from mlxcel.cli import OPTIONS
from mlxcel.testing.servers import MlxcelServer as Server
from mlxcel.testing.servers import free_port, server_exe


def run_cli(*args, env=None, timeout=60):
    return subprocess.run([server_exe(), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_help_shows_every_flag_with_default_and_env_twin():
    out = " ".join(run_cli("-h").stdout.split())
    for row in OPTIONS:
        assert row.flags[-1] in out and (row.env is None or row.env in out)
    for needle in ("--demo", "(default: 127.0.0.1)", "(default: 8080)", "(default: 4)",
                   "(default: console)"):
        assert needle in out


def test_help_never_prints_an_api_key_from_the_environment():
    out = run_cli("-h", env={"LLAMA_API_KEY": "very-secret-key"}).stdout
    assert "very-secret-key" not in out and "--api-key" in out


def test_missing_model_is_one_line_and_nonzero():
    proc = run_cli("--model", "/definitely/not/here")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "model not found" in lines[0] and "Traceback" not in proc.stderr


def test_no_model_at_all_asks_for_one():
    proc = run_cli(env={"LLAMA_ARG_MODEL": "", "MLXCEL_DEMO": ""})
    assert proc.returncode != 0 and "--model" in proc.stderr


def test_hugging_face_id_offline_fails_clearly(tmp_path):
    proc = run_cli("--model", "acme/never-downloaded",
                   env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "acme/never-downloaded" in lines[0]


def test_bad_env_value_is_a_clear_error():
    proc = run_cli("-h", env={"LLAMA_ARG_PORT": "eighty"})
    assert proc.returncode != 0 and "LLAMA_ARG_PORT" in proc.stderr


def test_plugins_lists_name_distribution_version_and_registrations():
    out = run_cli("plugins").stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("family-text"))
    assert "mlxcel" in line and "0.1.0" in line and "mlx-lm-text" in line
    assert "dialect-openai" in out and "dialects: openai" in out


def test_plugins_lists_the_tool_formats_most_specific_first():
    from mlxcel.plugins import load_plugins

    formats = load_plugins().tool_formats
    lines = run_cli("plugins").stdout.splitlines()
    if not len(formats):
        assert "tool formats: none installed" in lines
        return
    at = lines.index("tool formats, most specific first:")
    shown = [ln.split() for ln in lines[at + 1:at + 1 + len(formats)]]
    assert [(name, int(n), owner) for name, _, n, _, owner in shown] == sorted(
        ((k, f.specificity, formats.owner(k)) for k, f in formats.items()),
        key=lambda row: (-row[1], row[0]))


def test_plugins_with_a_model_says_which_tool_format_it_gets_and_why(tiny_checkpoint):
    from mlxcel.plugins import load_plugins

    formats = load_plugins().tool_formats
    *_, line, caps = run_cli("plugins", "--model", str(tiny_checkpoint)).stdout.splitlines()
    assert line.startswith(f"tool format for {tiny_checkpoint}: ")
    assert line.endswith("; family mlx-lm-text)")
    assert caps.startswith(f"chat template caps for {tiny_checkpoint} (")
    assert "system_role=True" in caps and "tool_calls=True" in caps and "call_ids=any" in caps
    if len(formats):  # any installed one can be forced
        name = next(iter(formats))
        proc = run_cli("plugins", "--model", str(tiny_checkpoint), "--tool-call-format", name)
        assert proc.stdout.splitlines()[-2] == \
            f"tool format for {tiny_checkpoint}: {name} (--tool-call-format; family mlx-lm-text)"
    proc = run_cli("plugins", "--model", str(tiny_checkpoint), "--tool-call-format", "nope")
    assert "--tool-call-format nope: no tool format named 'nope'" in one_line_error(proc)
    assert proc.stdout == ""


@pytest.mark.slow
def test_env_twins_configure_the_server(tiny_checkpoint):
    srv = Server([], env={"LLAMA_ARG_MODEL": str(tiny_checkpoint), "LLAMA_ARG_N_PARALLEL": "3",
                          "LLAMA_ARG_CTX_SIZE": "900", "LLAMA_ARG_ALIAS": "envmodel",
                          "LLAMA_API_KEY": "envkey"})
    try:
        health = httpx.get(srv.base_url + "/health").json()
        assert health["batch"]["max_batch_size"] == 3 and health["context_size"] == 300
        assert httpx.get(srv.base_url + "/v1/models").status_code == 401
        models = httpx.get(srv.base_url + "/v1/models",
                           headers={"Authorization": "Bearer envkey"}).json()
        assert models["data"][0]["id"] == "envmodel"
    finally:
        srv.stop()


@pytest.mark.slow
def test_demo_mode_builds_a_checkpoint_and_says_it_is_random(tmp_path):
    srv = Server(["--demo", "--log-format", "json"], env={"MLXCEL_CACHE_DIR": str(tmp_path)})
    try:
        assert "RANDOM weights" in srv.log()
        r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["model"] == "mlxcel-demo"
        assert any((tmp_path / "checkpoints").iterdir())
        import json

        json_lines = [json.loads(ln) for ln in srv.log().splitlines() if ln.startswith("{")]
        assert any(rec.get("event") == "request" for rec in json_lines)
    finally:
        srv.stop()


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "mlxcel.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "mlxcel" in proc.stdout


@pytest.mark.slow
def test_a_model_that_fails_to_load_stops_the_server_with_a_clear_error(tiny_checkpoint,
                                                                        tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    proc = run_cli("--model", str(broken), "--port", str(free_port()), timeout=120)
    assert proc.returncode != 0
    assert "the model failed to load" in proc.stderr


@pytest.mark.parametrize("env,args,needle", [
    ({"MLXCEL_REQUEST_MEMORY_BUDGET": "none"}, [], "MLXCEL_REQUEST_MEMORY_BUDGET"),
    ({"MLXCEL_REQUEST_MEMORY_BUDGET": "0"}, [], "MLXCEL_REQUEST_MEMORY_BUDGET"),
    ({"MLXCEL_LOOP_DETECTION": "sometimes"}, [], "MLXCEL_LOOP_DETECTION"),
    ({"MLXCEL_SWITCH_INTERVAL": "0"}, [], "MLXCEL_SWITCH_INTERVAL"),
    ({"MLXCEL_SWITCH_INTERVAL": "fast"}, [], "MLXCEL_SWITCH_INTERVAL"),
    ({"MLXCEL_SWITCH_INTERVAL": "2"}, [], "MLXCEL_SWITCH_INTERVAL"),
    ({"MLXCEL_FUSE_PROJECTIONS": "sometimes"}, [], "MLXCEL_FUSE_PROJECTIONS"),
    ({"MLXCEL_DECODE_ATTENTION": "fast"}, [], "MLXCEL_DECODE_ATTENTION"),
    ({"MLXCEL_SHARED_POSITIONS": "maybe"}, [], "MLXCEL_SHARED_POSITIONS"),
    ({"MLXCEL_DTYPE": "float64"}, [], "MLXCEL_DTYPE"),
    ({}, ["--top-p", "3"], "--top-p"),
    ({}, ["--max-queue-depth", "0"], "--max-queue-depth"),
    ({}, ["--max-connections", "0"], "--max-connections"),
    ({}, ["--idle-timeout", "0"], "--idle-timeout"),
    ({}, ["--body-timeout", "-1"], "--body-timeout"),
    ({}, ["--timeout", "0"], "--timeout"),
    ({"MLXCEL_SHUTDOWN_TIMEOUT": "-5"}, [], "--shutdown-timeout"),
    ({}, ["--port", "99999"], "--port"),
    ({}, ["--port", "0"], "--port"),
    ({}, ["--port=-1"], "--port"),
    ({}, ["--metrics-port", "70000"], "--metrics-port"),
    ({}, ["--host", "203.0.113.7"], "cannot listen on 203.0.113.7"),
    ({}, ["--tool-call-format", "nope"], "--tool-call-format nope: no tool format named 'nope'"),
    ({"MLXCEL_TOOL_CALL_FORMAT": "nope"}, [], "--tool-call-format nope: no tool format"),
])
def test_bad_startup_configuration_refuses_to_start(tiny_checkpoint, env, args, needle):
    proc = run_cli("--model", str(tiny_checkpoint), *args, env=env)
    assert proc.returncode != 0 and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--request-memory-budget", "none"], "not a positive byte size"),
    (["--loop-detection", "sometimes"], "MIN:MAX:COUNT"),
    (["--switch-interval", "0"], "(0, 1]"),
    (["--fuse-projections", "sometimes"], "auto, 1 or 0"),
    (["--decode-attention", "fast"], "expected one of auto, varlen"),
    (["--shared-positions", "maybe"], "expected on or off"),
])
def test_a_bad_engine_flag_is_refused_by_its_parser(args, needle):
    proc = run_cli("--model", "/unused", *args)
    assert proc.returncode == 2 and f"argument {args[0]}: " in proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mlxcel-server: error: ")
    return lines[0]


def test_a_port_in_use_is_one_line_and_status_2():
    import socket

    with socket.socket() as sock:  # a plain listener: no SO_REUSEPORT to share it with
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        proc = run_cli("--model", "/unused", "--port", str(port))
    assert one_line_error(proc) == f"mlxcel-server: error: port {port} is in use"


@pytest.mark.slow
def test_a_host_name_is_resolved_for_granian(tiny_checkpoint):
    srv = Server(["--model", str(tiny_checkpoint), "--host", "localhost"])
    try:
        assert httpx.get(srv.base_url + "/health").status_code == 200
    finally:
        srv.stop()


def test_a_host_that_does_not_resolve_is_one_line():
    proc = run_cli("--model", "/unused", "--host", "no-such-host.invalid",
                   "--port", str(free_port()))
    assert "cannot listen on no-such-host.invalid" in one_line_error(proc)


@pytest.mark.parametrize("content", ["[1, 2]", '"qwen3"', "3"])
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    proc = run_cli("--model", str(tmp_path), "--port", str(free_port()))
    assert "config.json is not a JSON object" in one_line_error(proc)
    assert "Traceback" not in proc.stderr


def test_api_key_file_missing_empty_or_doubled_is_one_line(tmp_path):
    missing = run_cli("--api-key-file", str(tmp_path / "nope"), "--port", str(free_port()))
    assert "cannot read --api-key-file" in one_line_error(missing)
    empty = tmp_path / "empty"
    empty.write_text("\n  \n# only a comment\n")
    assert "it holds no key" in one_line_error(run_cli("--api-key-file", str(empty)))
    comma = tmp_path / "comma"
    comma.write_text("a,b\n")
    assert "may not hold a comma" in one_line_error(run_cli("--api-key-file", str(comma)))
    keyfile = tmp_path / "key"
    keyfile.write_text("file-secret-123\n")
    for args, env in ((["--api-key", "flag-secret-456"], {}), ([], {"LLAMA_API_KEY": "x"})):
        proc = run_cli("--api-key-file", str(keyfile), *args, env=env)
        assert "not both" in one_line_error(proc)
        assert "file-secret-123" not in proc.stderr and "flag-secret-456" not in proc.stderr


def test_a_key_option_with_no_key_refuses_to_start(tmp_path):
    """An empty key list would turn auth off silently: one line, status 2."""
    port = str(free_port())
    for value in ("", ",", " ", " , "):
        proc = run_cli("--demo", "--api-key", value, "--port", port)
        assert "holds no key" in one_line_error(proc)
    proc = run_cli("--demo", "--port", port, env={"LLAMA_API_KEY": ","})
    assert "holds no key" in one_line_error(proc)
    assert "names no file" in one_line_error(run_cli("--demo", "--api-key-file", ""))


@pytest.mark.slow
def test_api_key_file_with_a_bom_serves_the_key_without_it(tiny_checkpoint, tmp_path):
    keyfile = tmp_path / "key"
    keyfile.write_bytes("\ufeffbom-secret-1\n".encode())
    srv = Server(["--model", str(tiny_checkpoint), "--api-key-file", str(keyfile)])
    try:
        ok = httpx.get(srv.base_url + "/v1/models",
                       headers={"Authorization": "Bearer bom-secret-1"})
        assert ok.status_code == 200
    finally:
        srv.stop()


def test_help_never_prints_the_key_of_an_api_key_file(tmp_path):
    keyfile = tmp_path / "key"
    keyfile.write_text("file-secret-123\n")
    out = run_cli("-h", env={"LLAMA_ARG_API_KEY_FILE": str(keyfile)}).stdout
    assert "--api-key-file" in out and "file-secret-123" not in out


@pytest.mark.slow
def test_api_key_file_protects_the_server_and_stays_out_of_the_log(tiny_checkpoint, tmp_path):
    """One key per line, as llama-server reads the file: blank and # lines skipped."""
    keyfile = tmp_path / "key"
    keyfile.write_text("  file-secret-123  \n\n# a comment\nsecond-key-456\n")
    srv = Server(["--model", str(tiny_checkpoint), "--api-key-file", str(keyfile)])
    try:
        assert httpx.get(srv.base_url + "/v1/models").status_code == 401
        for wrong in ("# a comment", "file-secret-123,second-key-456", "a comment"):
            headers = {"Authorization": f"Bearer {wrong}"}
            assert httpx.get(srv.base_url + "/v1/models", headers=headers).status_code == 401
        for key in ("file-secret-123", "second-key-456"):
            good = {"Authorization": f"Bearer {key}"}
            assert httpx.get(srv.base_url + "/v1/models", headers=good).status_code == 200
        assert "file-secret-123" not in srv.log() and "second-key-456" not in srv.log()
    finally:
        srv.stop()


def _nofile_limits(pid: int) -> tuple[int, int]:
    from pathlib import Path

    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files line")


@pytest.mark.slow
@pytest.mark.parametrize("max_connections", [2048, 8000])
def test_the_open_file_limit_is_raised_for_max_connections(tiny_checkpoint, max_connections):
    import resource
    from pathlib import Path

    def low_limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    srv = Server(["--model", str(tiny_checkpoint), "--max-connections", str(max_connections)],
                 preexec_fn=low_limits)
    try:
        worker = int(Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children")
                     .read_text().split()[0])  # Granian's worker holds the connections
        soft, hard = _nofile_limits(worker)
        needed = max_connections + 256
        assert hard == 4096 and soft == min(hard, needed)
        assert ("fd_limit_low" in srv.log()) == (hard < needed)
    finally:
        srv.stop()


def test_a_hard_open_file_limit_below_mlx_lms_is_one_line(tiny_checkpoint):
    import resource

    def low_limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))

    proc = subprocess.run([server_exe(), "--model", str(tiny_checkpoint), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=60,
                          preexec_fn=low_limits)
    assert "open-file hard limit is 1024" in one_line_error(proc)
