"""The mlxcel-server command line: help, env twins, errors, plugins, demo mode."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from mlxcel.cli import OPTIONS
from serverproc import Server, server_exe


def run_cli(*args, env=None, timeout=60):
    return subprocess.run([server_exe(), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_help_shows_every_flag_with_default_and_env_twin():
    out = " ".join(run_cli("-h").stdout.split())
    for flags, _dest, _type, _default, env, _help in OPTIONS:
        assert flags[-1] in out and env in out
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
    proc = run_cli("--model", str(broken), "--port", "0", timeout=120)
    assert proc.returncode != 0
    assert "the model failed to load" in proc.stderr


@pytest.mark.parametrize("env,args,needle", [
    ({"MLXCEL_REQUEST_MEMORY_BUDGET": "none"}, [], "MLXCEL_REQUEST_MEMORY_BUDGET"),
    ({"MLXCEL_REQUEST_MEMORY_BUDGET": "0"}, [], "MLXCEL_REQUEST_MEMORY_BUDGET"),
    ({"MLXCEL_LOOP_DETECTION": "sometimes"}, [], "MLXCEL_LOOP_DETECTION"),
    ({"MLXCEL_SWITCH_INTERVAL": "0"}, [], "MLXCEL_SWITCH_INTERVAL"),
    ({"MLXCEL_SWITCH_INTERVAL": "fast"}, [], "MLXCEL_SWITCH_INTERVAL"),
    ({}, ["--top-p", "3"], "--top-p"),
    ({}, ["--max-queue-depth", "0"], "--max-queue-depth"),
])
def test_bad_startup_configuration_refuses_to_start(tiny_checkpoint, env, args, needle):
    proc = run_cli("--model", str(tiny_checkpoint), *args, env=env)
    assert proc.returncode != 0 and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
