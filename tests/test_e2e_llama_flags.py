"""End to end on the real mlxcel-server, started with a llama-server command line
(issue #33): the images routes answer 501 naming --image-model, --host binds each of
several addresses, --tags shows in /v1/models, --reasoning off renders the template with
enable_thinking false, -v adds __verbose (whole answers, a chat stream's finishing chunk,
every chunk of a completion stream), and CORS answers as llama-server does (the
matrix: loopback origins with and without ports, listed and foreign origins, preflights,
credentials; a foreign origin gets 200 without CORS headers, never 403)."""

from __future__ import annotations

import json
import socket
import subprocess

import httpx
import pytest
from mlxcel.testing.servers import MlxcelServer, free_port, server_exe

pytestmark = pytest.mark.slow
KEY = "k-llama-flags-e2e"
AUTH = {"Authorization": f"Bearer {KEY}"}
APP = "https://app.example:8443"
IMAGE_PATHS = ["/v1/images/generations", "/v1/images/edits", "/images/generations",
               "/images/edits"]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


HOSTS = "127.0.0.1,::1" if ipv6_loopback() else "127.0.0.1,localhost"


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    srv = MlxcelServer(["-m", str(tiny_checkpoint), "--host", HOSTS, "--tags", "alpha,beta",
                        "--reasoning", "off", "-v", "--api-key", KEY,
                        "--cors-origins", f"localhost,{APP}", "--cors-methods", "GET, POST",
                        "--cors-headers", "*"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60, trust_env=False) as client:
        yield client


# -- 1. images: mounted, 501 naming the flag -------------------------------------------------


@pytest.mark.parametrize("path", IMAGE_PATHS)
def test_images_routes_answer_501_naming_the_image_model_flag(http, path):
    r = http.post(path, headers=AUTH, json={"prompt": "a cat"})
    assert r.status_code == 501
    error = r.json()["error"]
    assert error["type"] == "not_implemented"
    assert "--image-model" in error["message"] and "MLXCEL_IMAGE_MODEL" in error["message"]
    assert path in error["message"]


def test_image_model_refuses_to_start_in_one_line(tiny_checkpoint):
    proc = subprocess.run([server_exe(), "-m", str(tiny_checkpoint), "--port",
                           str(free_port()), "--image-model", "some/model"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "images API is not built yet" in lines[0]


# -- 2. flags ---------------------------------------------------------------------------------


def test_every_host_address_serves(server):
    second = HOSTS.split(",")[1]
    url = f"http://[{second}]:{server.port}" if ":" in second else \
        f"http://{second}:{server.port}"
    for base in (server.base_url, url):
        r = httpx.get(base + "/v1/models", headers=AUTH, timeout=30, trust_env=False)
        assert r.status_code == 200, base


def test_tags_are_listed_in_v1_models(http):
    entries = http.get("/v1/models", headers=AUTH).json()["data"]
    assert [e["tags"] for e in entries] == [["alpha", "beta"]]


def test_reasoning_off_renders_enable_thinking_false(http):
    prompt = http.post("/apply-template", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n")  # qwen3's template with thinking off
    on = http.post("/apply-template", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": True}}).json()["prompt"]
    assert not on.endswith("</think>\n\n")  # a request's kwargs still win


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"})])
def test_verbose_adds_the_native_answer(http, path, body):
    r = http.post(path, headers=AUTH, json={**body, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200
    out = r.json()
    verbose = out["__verbose"]
    text = out["choices"][0].get("text", out["choices"][0].get("message", {}).get("content"))
    assert verbose["content"] == text and verbose["stop"] is True
    assert verbose["tokens_predicted"] == out["usage"]["completion_tokens"] == 3
    assert verbose["tokens_evaluated"] == out["usage"]["prompt_tokens"]
    assert verbose["stop_type"] == "limit" and verbose["stopping_word"] == ""


def frames(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_verbose_in_a_chat_stream_rides_the_finishing_chunk_only(http):
    r = http.post("/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "stream": True})
    chunks = frames(r)
    [finishing] = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    verbose = finishing["__verbose"]  # llama-server: the final result's first chunk
    assert verbose["stop"] is True and verbose["content"] == ""  # the text was streamed
    assert verbose["tokens_predicted"] == 3 and verbose["stop_type"] == "limit"
    assert verbose["tokens_evaluated"] > 0 and verbose["id_slot"] == -1
    assert [c for c in chunks if "__verbose" in c] == [finishing]


def test_verbose_in_a_completion_stream_rides_every_chunk(http):
    r = http.post("/v1/completions", headers=AUTH, json={
        "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "stream": True,
        "ignore_eos": True})
    chunks = frames(r)
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert texts and all(c["__verbose"]["content"] == c["choices"][0]["text"]
                         and c["__verbose"]["stop"] is False for c in texts)
    predicted = [c["__verbose"]["tokens_predicted"] for c in texts]
    assert predicted == sorted(predicted) and predicted[-1] <= 4
    assert sum(len(c["__verbose"]["tokens"]) for c in texts) == predicted[-1]
    [final] = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final["__verbose"]["stop"] is True and final["__verbose"]["content"] == ""
    assert final["__verbose"]["tokens_predicted"] == 4
    assert final["__verbose"]["tokens_evaluated"] == texts[0]["__verbose"]["tokens_evaluated"]


# -- 3. CORS as llama-server answers it -------------------------------------------------------

ALLOWED = ["http://localhost:3000", "http://localhost", "http://127.0.0.1",
           "http://127.0.0.1:5173", "http://[::1]:3000", "http://[::1]", APP]
REFUSED = ["https://evil.example", "http://localhost.evil.example", "http://127.0.0.2",
           "https://app.example", "null", "http://app.example:8443"]


def preflight(http, origin: str) -> httpx.Response:
    return http.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("access-control-")}


@pytest.mark.parametrize("origin", ALLOWED)
def test_an_allowed_origin_is_reflected_with_the_flags_answers(http, origin):
    pre = preflight(http, origin)  # no key: browsers send none on a preflight
    assert pre.status_code == 200
    assert cors_headers(pre) == {
        "access-control-allow-origin": origin, "access-control-allow-credentials": "true",
        "access-control-allow-methods": "GET, POST",
        "access-control-allow-headers": "authorization, content-type",
        "access-control-expose-headers": "x-request-id"}
    r = http.get("/v1/models", headers={**AUTH, "Origin": origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "Origin" in r.headers["vary"]


@pytest.mark.parametrize("origin", REFUSED)
def test_a_foreign_origin_gets_200_without_cors_headers(http, origin):
    pre = preflight(http, origin)
    assert pre.status_code == 200 and cors_headers(pre) == {}
    r = http.get("/v1/models", headers={**AUTH, "Origin": origin})
    assert r.status_code == 200 and cors_headers(r) == {}


def test_errors_carry_cors_headers_and_the_guards_stay(http, server):
    """A 401 still names an allowed origin; a browser's simple POST (text/plain) is 415;
    a rebinding Host is 403, whatever the origin."""
    origin = "http://localhost:3000"
    no_key = http.post("/v1/chat/completions", json={}, headers={"Origin": origin})
    assert no_key.status_code == 401
    assert no_key.headers["access-control-allow-origin"] == origin
    simple = http.post("/v1/chat/completions", content=b'{"messages": []}', headers={
        **AUTH, "Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert simple.status_code == 415 and cors_headers(simple) == {}
    rebound = http.get("/v1/models", headers={
        **AUTH, "Origin": origin, "Host": f"attacker.example:{server.port}"})
    assert rebound.status_code == 403


def test_no_credentials_flag_drops_the_credentials_header(tiny_checkpoint):
    srv = MlxcelServer(["-m", str(tiny_checkpoint), "--no-cors-credentials"])
    try:
        r = httpx.options(srv.base_url + "/v1/chat/completions", trust_env=False, headers={
            "Origin": "http://127.0.0.1:3000", "Access-Control-Request-Method": "POST"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
        assert "access-control-allow-credentials" not in r.headers
    finally:
        srv.stop()
