"""Images end to end (issue #30): the real ``mlxcel-server`` on the tiny Qwen2-VL checkpoint
(``cached_vlm_checkpoint("qwen2_vl")``) driven by the real ``openai`` and ``anthropic``
SDKs, the spec's fetch policy and media limits through the routes, a text-only model, and
image rows in the continuous batch and the prompt cache.

* Chat (``image_url`` data URIs, ``detail``, streamed and not), Anthropic ``image`` blocks
  (``base64`` and ``url`` sources, an image inside a ``tool_result``, ``count_tokens``)
  and Responses ``input_image`` (the first response's ``output`` sent back with a new
  image) all answer 200, and count the image as the model's processor expands it: the
  expected growth is computed here from mlx-vlm's processor, never written down.
* The fetch policy: a canary HTTP server on loopback records every request it gets; image
  URLs at it (by address, ``localhost``, IPv6 loopback, a mapped address), at the metadata
  address, a redirect from a "public" host into it, and local files outside
  ``--media-path`` (a path, a symlink out, ``..``) are each a 400 naming the part and
  echoing neither the address nor the path; the canary is never hit; the server keeps
  serving. The public host is simulated as core/tests/test_media_fetch.py simulates it:
  the server process's address guard resolves ``media.example`` to a public address and
  its dial to that address reaches the ``origin`` server on loopback (a ``sitecustomize``
  on the server's PYTHONPATH patches ``mlxcel.media.addresses.resolve``/``open_tcp``,
  the guard's two network seams); every check of the guard still runs.
* Limits (the server runs with ``--max-images 3`` and a 64 KiB ``--max-image-payload-size``):
  an oversize payload (data URI, file, URL), too many images (refused before any fetch),
  decompression bombs, a corrupt PNG, PNG bytes declared ``image/jpeg``: 400 naming the part.
* A text-only model (the tiny qwen3 checkpoint, private URLs allowed so that a fetch would
  reach the canary): 501 ``not_supported_error`` and nothing fetched.
* Greedy output of an image row alone equals its output beside text rows and another image
  row (``--parallel 4``); a repeated image is read from the prompt cache past the image,
  a different image with the same text is not read past the image's first token.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import anthropic
import httpx
import numpy as np
import openai
import pytest
from mlxcel.testing.media_hosts import RecordingHandler, loopback_hosts
from mlxcel.testing.servers import MlxcelServer
from PIL import Image

pytestmark = pytest.mark.slow

MAX_BYTES = 64 << 10  # the VLM server's --max-image-payload-size
MAX_IMAGES = 3  # its --max-images
PUBLIC_HOST, PUBLIC_IP = "media.example", "93.184.216.34"
QUESTION = "What is in this picture?"
# long enough after the image that a block-granular cache can cover the image
LONG_QUESTION = ("Describe this picture in detail: the colours, the shapes, the textures, "
                 "anything written on it, and what it might be used for in a kitchen.")
GREEDY = {"temperature": 0.0, "max_tokens": 8}
EXTRA = {"ignore_eos": True}


# --- images -------------------------------------------------------------------------------


def png(seed: int, side: int = 56) -> bytes:
    """A noise PNG of ``side`` x ``side`` pixels (56: a handful of image tokens)."""
    pixels = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(
        ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def bomb_png(side: int) -> bytes:
    """A well-formed 1-bit greyscale PNG of ``side`` x ``side`` zero pixels: a few KiB that
    decode to ``side**2`` pixels (an RGB decode of 12000x12000 is 432 MB)."""
    row = b"\0" * (1 + (side + 7) // 8)
    pack = zlib.compressobj(9)
    idat = b"".join(pack.compress(row) for _ in range(side)) + pack.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))


BIG = png(7, side=160)  # a noise PNG over MAX_BYTES
assert len(BIG) > MAX_BYTES


# --- the canary and the simulated public origin ------------------------------------------


class Handler(RecordingHandler):
    def route(self, url):
        if url.path == "/x.png":
            self.send(200, png(11), Content_Type="image/png")
        elif url.path == "/big.png":
            self.send(200, BIG, Content_Type="image/png")
        else:
            super().route(url)  # /to?u=: a redirect to u; else 404


# The server process's seam: ``media.example`` resolves to PUBLIC_IP, and a dial to
# PUBLIC_IP reaches the origin on loopback while reporting PUBLIC_IP as the peer; every
# other name resolves and dials as usual (core/tests/test_media_fetch.py's public_origin).
SITECUSTOMIZE = f'''
import os
if os.environ.get("E2E_VISION_ORIGIN_PORT"):
    from mlxcel.testing.media_hosts import install_public_host

    install_public_host({PUBLIC_HOST!r}, {PUBLIC_IP!r}, int(os.environ["E2E_VISION_ORIGIN_PORT"]))
'''


@pytest.fixture(scope="module")
def hosts():
    """``canary`` (the private target, 127.0.0.1), ``canary6`` (on ::1 where the machine
    has it, else None) and ``origin`` (the simulated public host)."""
    with loopback_hosts(Handler) as made:
        yield made


def canary_hits(hosts) -> list[str]:
    return hosts["canary"].hits + (hosts["canary6"].hits if hosts["canary6"] else [])


def origin_url(hosts, path: str) -> str:
    return f"http://{PUBLIC_HOST}:{hosts['origin'].port}{path}"


# --- servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm_checkpoint(mlxcel_checkpoint_cache):
    from mlxcel.testing.vlm_checkpoints import cached_vlm_checkpoint

    return cached_vlm_checkpoint("qwen2_vl", mlxcel_checkpoint_cache)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``root`` (the --media-path), with ``ok.png``, ``big.png`` and ``escape.png`` (a
    symlink to ``secret``); ``secret``: a valid PNG outside the root, so that a read that
    slipped through would answer 200; ``site``: the server's sitecustomize."""
    base = tmp_path_factory.mktemp("vision-media")
    root, outside = base / "root", base / "private-area"
    root.mkdir()
    outside.mkdir()
    (root / "ok.png").write_bytes(png(21))
    (root / "big.png").write_bytes(BIG)
    secret = outside / "secret-photo.png"
    secret.write_bytes(png(22))
    (root / "escape.png").symlink_to(secret)
    site = base / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    return {"root": root, "secret": secret, "site": site}


@pytest.fixture(scope="module")
def vlm(vlm_checkpoint, files, hosts):
    """The VLM server: --parallel 4, a --media-path, small limits, the simulated origin."""
    path = os.pathsep.join(p for p in (str(files["site"]), os.environ.get("PYTHONPATH"))
                           if p)
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": path, "MLXCEL_ALLOW_PRIVATE_MEDIA_URLS": "0",
           "E2E_VISION_ORIGIN_PORT": str(hosts["origin"].port)}
    srv = MlxcelServer(["--model", str(vlm_checkpoint), "--parallel", "4",
                        "--media-path", str(files["root"]), "--max-images", str(MAX_IMAGES),
                        "--max-image-payload-size", str(MAX_BYTES)], env=env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def text_server(tiny_checkpoint):
    """A text-only model; private URLs allowed, so that any fetch would reach the canary."""
    srv = MlxcelServer(["--model", str(tiny_checkpoint), "--parallel", "1"],
                       env={"MLXCEL_ALLOW_PRIVATE_MEDIA_URLS": "1"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(vlm):
    with httpx.Client(base_url=vlm.base_url, timeout=60, trust_env=False) as c:
        yield c


@pytest.fixture(scope="module")
def oai(vlm):
    return openai.OpenAI(base_url=vlm.base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def claude(vlm):
    return anthropic.Anthropic(base_url=vlm.base_url, api_key="none", max_retries=0)


# --- what the processor says ---------------------------------------------------------------


class Expansion:
    """The checkpoint's processor (mlx-vlm's, as the family loads it), read independently
    of the server: how many tokens an image becomes and where they stand in a prompt."""

    def __init__(self, checkpoint):
        from mlx_vlm.utils import get_model_and_args, load_config, load_processor

        get_model_and_args(load_config(checkpoint))  # registers mlx-vlm's processor class
        self.processor = load_processor(checkpoint)
        self.tokenizer = self.processor.tokenizer

    def image_tokens(self, data: bytes) -> int:
        """The image's token count: its patch grid over the merge size squared."""
        image = Image.open(io.BytesIO(data)).convert("RGB")
        grid = self.processor.image_processor(images=[image], return_tensors="np")
        merge = int(self.processor.image_processor.merge_size)
        return int(np.prod(np.asarray(grid["image_grid_thw"]).reshape(-1))) // merge ** 2

    def render(self, content: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True,
            tokenize=False)

    def ids(self, content: list[dict], images: list[bytes]) -> list[int]:
        """The processor's own token ids of a one-message prompt with ``images``."""
        text = self.render(content)
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        pil = [Image.open(io.BytesIO(d)).convert("RGB") for d in images]
        out = self.processor(text=[text], images=pil, return_tensors="np")
        return [int(t) for t in np.asarray(out["input_ids"]).reshape(-1)]

    def growth(self, data: bytes, text: str = QUESTION) -> int:
        """How many more prompt tokens ``text`` after the image has than ``text`` alone,
        as the processor expands it; also checked against the sum the template and the
        grid give: the image tokens, less the placeholder they replace, plus what the
        template prints around an image (Qwen2-VL: vision start, pad, vision end)."""
        with_image = self.ids([{"type": "image"}, {"type": "text", "text": text}], [data])
        alone = self.ids([{"type": "text", "text": text}], [])
        printed = len(self.tokenizer.encode(
            self.render([{"type": "image"}, {"type": "text", "text": text}]),
            add_special_tokens=False)) - len(alone)
        assert len(with_image) - len(alone) == self.image_tokens(data) - 1 + printed
        return len(with_image) - len(alone)

    def image_span(self, content: list[dict], images: list[bytes]) -> tuple[int, int, int]:
        """(first image token, one past the last, prompt length) in the expanded prompt."""
        ids = self.ids(content, images)
        at = [i for i, t in enumerate(ids) if t == int(self.processor.image_token_id)]
        assert at and at == list(range(at[0], at[-1] + 1)), at
        return at[0], at[-1] + 1, len(ids)


@pytest.fixture(scope="module")
def expansion(vlm_checkpoint):
    return Expansion(vlm_checkpoint)


# --- helpers ---------------------------------------------------------------------------------


def image_message(url: str, text: str = QUESTION, **image) -> dict:
    return {"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": url, **image}}]}


def chat(http, messages, **extra) -> httpx.Response:
    return http.post("/v1/chat/completions", json={
        "model": "vlm", "messages": messages, **GREEDY, **EXTRA, **extra})


def assert_refused(r: httpx.Response, part: str, hidden=(), status: int = 400,
                   kind: str = "invalid_request_error") -> str:
    """``r`` is ``status`` with ``kind``, names ``part``, and shows nothing of ``hidden``."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == kind, error
    assert error.get("param") == part and part in error["message"], error
    for secret in hidden:
        assert secret not in r.text, (secret, r.text)
    return error["message"]


def assert_serving(http) -> None:
    assert http.get("/health").status_code == 200
    r = chat(http, [image_message(data_uri(png(99)))])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == GREEDY["max_tokens"]


# --- 1. the openai SDK: chat ----------------------------------------------------------------


@pytest.mark.parametrize("detail", [None, "low", "high", "auto"])
def test_chat_counts_the_image_tokens_the_processor_makes(oai, expansion, detail):
    image = png(1)
    extra = {"detail": detail} if detail else {}
    with_image = oai.chat.completions.create(
        model="vlm", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(image), **extra}},
            {"type": "text", "text": QUESTION}]}], **GREEDY, extra_body=EXTRA)
    alone = oai.chat.completions.create(
        model="vlm", messages=[{"role": "user", "content": QUESTION}], **GREEDY,
        extra_body=EXTRA)
    assert with_image.choices[0].finish_reason == "length"
    assert with_image.usage.completion_tokens == GREEDY["max_tokens"]
    growth = with_image.usage.prompt_tokens - alone.usage.prompt_tokens
    assert growth == expansion.growth(image), (with_image.usage, alone.usage)
    assert with_image.usage.prompt_tokens == len(expansion.ids(
        [{"type": "image"}, {"type": "text", "text": QUESTION}], [image]))


def test_chat_streamed_equals_not_streamed(oai):
    messages = [image_message(data_uri(png(2)))]
    whole = oai.chat.completions.create(model="vlm", messages=messages, **GREEDY,
                                        extra_body=EXTRA)
    chunks = list(oai.chat.completions.create(
        model="vlm", messages=messages, **GREEDY, extra_body=EXTRA, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == GREEDY["max_tokens"]


# --- 2. the anthropic SDK ------------------------------------------------------------------


def anthropic_image(source: dict, text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "source": source},
                                         {"type": "text", "text": text}]}]


def test_anthropic_base64_image_and_count_tokens(claude, expansion):
    image = png(3)
    messages = anthropic_image({"type": "base64", "media_type": "image/png",
                                "data": b64(image)})
    counted = claude.messages.count_tokens(model="vlm", messages=messages)
    alone = claude.messages.count_tokens(
        model="vlm", messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens - alone.input_tokens == expansion.growth(image)
    msg = claude.messages.create(model="vlm", max_tokens=8, messages=messages,
                                 extra_body={"temperature": 0, **EXTRA})
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    usage = msg.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens


@pytest.mark.parametrize("where", ["file", "bare path", "http"])
def test_anthropic_url_image_source(claude, files, hosts, expansion, where):
    url = {"file": (files["root"] / "ok.png").as_uri(), "bare path": str(files["root"] / "ok.png"),
           "http": origin_url(hosts, "/x.png")}[where]
    before = len(hosts["origin"].hits)
    messages = anthropic_image({"type": "url", "url": url})
    msg = claude.messages.create(model="vlm", max_tokens=4, messages=messages,
                                 extra_body={"temperature": 0, **EXTRA})
    assert msg.usage.output_tokens == 4
    counted = claude.messages.count_tokens(model="vlm", messages=messages)
    alone = claude.messages.count_tokens(
        model="vlm", messages=[{"role": "user", "content": QUESTION}])
    image = (files["root"] / "ok.png").read_bytes() if where != "http" else png(11)
    assert counted.input_tokens - alone.input_tokens == expansion.growth(image)
    if where == "http":
        assert hosts["origin"].hits[before:] == ["/x.png", "/x.png"]
    assert canary_hits(hosts) == []


SHOT = {"name": "screenshot", "description": "Take a screenshot of the screen.",
        "input_schema": {"type": "object", "properties": {}}}


def tool_loop(result: list[dict]) -> list[dict]:
    return [{"role": "user", "content": "Take a screenshot and tell me what you see."},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": result}]}]


def test_anthropic_image_inside_a_tool_result(claude, expansion):
    image = png(4)
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": b64(image)}}
    note = {"type": "text", "text": "The screenshot."}
    messages = tool_loop([note, shot])
    msg = claude.messages.create(model="vlm", max_tokens=6, tools=[SHOT], messages=messages,
                                 extra_body={"temperature": 0, **EXTRA})
    assert msg.usage.output_tokens == 6
    counted = claude.messages.count_tokens(model="vlm", tools=[SHOT], messages=messages)
    text_only = claude.messages.count_tokens(model="vlm", tools=[SHOT],
                                             messages=tool_loop([note]))
    # the image's tokens (and the template's around them) are in the prompt
    assert counted.input_tokens - text_only.input_tokens >= expansion.image_tokens(image) + 2
    usage = msg.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens


@pytest.mark.parametrize("where", ["first block", "after a system prompt", "in a tool_result"])
def test_anthropic_wrong_mime_type_names_the_clients_part(claude, where):
    """PNG bytes declared image/jpeg: the bytes decide, and a disagreement is a 400 that
    names the block as the client sent it (a system prompt is no message; an image in a
    tool_result is the result's content)."""
    jpeg = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                        "data": b64(png(5))}}
    kw: dict = {"messages": [{"role": "user", "content": [jpeg, {"type": "text",
                                                                 "text": QUESTION}]}]}
    part = "messages[0].content[0]"
    if where == "after a system prompt":
        kw["system"] = "You describe images."
    elif where == "in a tool_result":
        kw = {"tools": [SHOT], "messages": tool_loop([{"type": "text", "text": "Done."}, jpeg])}
        part = "messages[2].content[0].content[1]"
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="vlm", max_tokens=4, **kw)
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert message.startswith(f"{part}: ") and "image/jpeg" in message, message


# --- 3. Responses -----------------------------------------------------------------------------


def test_responses_input_image_and_its_output_sent_back(oai, expansion):
    first_image, second_image = png(6), png(8)
    turn1 = [{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": data_uri(first_image), "detail": "auto"}]}]
    first = oai.responses.create(model="vlm", input=turn1, max_output_tokens=6,
                                 temperature=0, extra_body=EXTRA)
    assert first.usage.output_tokens == 6 and first.output[0].type == "message"
    alone = oai.responses.create(model="vlm", max_output_tokens=1, extra_body=EXTRA,
                                 input=[{"role": "user", "content": [
                                     {"type": "input_text", "text": QUESTION}]}])
    assert first.usage.input_tokens - alone.usage.input_tokens == expansion.growth(first_image)
    turn2 = [*turn1, *[item.model_dump(exclude_none=True) for item in first.output],
             {"role": "user", "content": [
                 {"type": "input_text", "text": "And this one?"},
                 {"type": "input_image", "image_url": data_uri(second_image),
                  "detail": "low"}]}]
    second = oai.responses.create(model="vlm", input=turn2, max_output_tokens=6,
                                  temperature=0, extra_body=EXTRA)
    assert second.status == "incomplete" and second.usage.output_tokens == 6
    assert second.usage.input_tokens >= first.usage.input_tokens + \
        expansion.image_tokens(second_image) + 2


def test_responses_refusals_name_the_input_item(http):
    r = http.post("/v1/responses", json={
        "model": "vlm", "instructions": "Be brief.", "max_output_tokens": 2, "input": [
            {"role": "user", "content": "Hello."},
            {"role": "user", "content": [
                {"type": "input_text", "text": QUESTION},
                {"type": "input_image", "image_url": data_uri(png(12), "image/jpeg")}]}]})
    reason = assert_refused(r, "input[1].content[1]")
    assert "image/jpeg" in reason, reason


# --- 4. the fetch policy through the route -------------------------------------------------


def _policy_cases(hosts, files):
    port = hosts["canary"].port
    six = hosts["canary6"].port if hosts["canary6"] is not None else port
    canary = f"http://127.0.0.1:{port}/x.png"
    hop = origin_url(hosts, "/to?u=" + quote(canary, safe=""))
    root, secret = files["root"], files["secret"]
    return {  # name: (source, what the answer must not show)
        "loopback": (canary, ["127.0.0.1", str(port)]),
        "localhost": (f"http://localhost:{port}/x.png", ["localhost", str(port)]),
        "metadata": ("http://169.254.169.254/latest/meta-data/", ["169.254", "meta-data"]),
        "ipv6 loopback": (f"http://[::1]:{six}/x.png", ["::1", str(six)]),
        "mapped": (f"http://[::ffff:127.0.0.1]:{port}/x.png", ["ffff", "127.0.0.1"]),
        "redirect": (hop, ["127.0.0.1", str(port), PUBLIC_HOST]),
        "redirect chain": (origin_url(hosts, "/to?u=" + quote(hop, safe="")),
                           ["127.0.0.1", str(port), PUBLIC_HOST]),
        "file outside": (secret.as_uri(), [secret.name, secret.parent.name]),
        "path outside": (str(secret), [secret.name, secret.parent.name]),
        "symlink out": ((root / "escape.png").as_uri(), ["escape", secret.name]),
        "dot-dot": (f"{root.as_uri()}/../{secret.parent.name}/{secret.name}",
                    [secret.name, secret.parent.name]),
        "dot-dot path": (f"{root}/../{secret.parent.name}/{secret.name}",
                         [secret.name, secret.parent.name]),
    }


POLICY = ["loopback", "localhost", "metadata", "ipv6 loopback", "mapped", "redirect",
          "redirect chain", "file outside", "path outside", "symlink out", "dot-dot",
          "dot-dot path"]


@pytest.mark.parametrize("case", POLICY)
def test_the_fetch_policy_refuses_and_the_canary_is_never_hit(http, hosts, files, case):
    source, hidden = _policy_cases(hosts, files)[case]
    origin_before = len(hosts["origin"].hits)
    r = chat(http, [image_message(source)])
    reason = assert_refused(r, "messages[0].content[1]", hidden=[*hidden, str(files["root"])])
    assert canary_hits(hosts) == [], case
    if case.startswith("redirect"):  # the public first hop was fetched, the private one not
        hops = 2 if case == "redirect chain" else 1
        assert len(hosts["origin"].hits) - origin_before == hops
        assert "non-public" in reason, reason
    assert_serving(http)


def test_the_controls_of_the_policy_are_served(http, hosts, files):
    """A public host and files inside --media-path are read: the refusals above are the
    policy's, not unreachable sources."""
    before = len(hosts["origin"].hits)
    for source in (origin_url(hosts, "/x.png"), (files["root"] / "ok.png").as_uri(),
                   str(files["root"] / "ok.png"), f"{files['root'].as_uri()}/./ok.png"):
        r = chat(http, [image_message(source)])
        assert r.status_code == 200, (source, r.text)
    assert hosts["origin"].hits[before:] == ["/x.png"]
    assert canary_hits(hosts) == []


# --- 5. limits -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["data uri", "file", "http"])
def test_a_payload_over_the_limit_names_the_part(http, hosts, files, where):
    source = {"data uri": data_uri(BIG), "file": (files["root"] / "big.png").as_uri(),
              "http": origin_url(hosts, "/big.png")}[where]
    r = chat(http, [image_message(source)])
    reason = assert_refused(r, "messages[0].content[1]", hidden=["big.png", PUBLIC_HOST])
    assert "--max-image-payload-size" in reason, reason
    assert canary_hits(hosts) == []


def test_more_images_than_the_limit_are_refused_before_any_fetch(http, hosts):
    before = len(hosts["origin"].hits)
    content = [{"type": "text", "text": QUESTION}] + [
        {"type": "image_url", "image_url": {"url": origin_url(hosts, f"/x.png?n={i}")}}
        for i in range(MAX_IMAGES + 1)]
    r = chat(http, [{"role": "user", "content": content}])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "--max-images" in error["message"]
    assert error["param"] == "messages", error
    assert hosts["origin"].hits[before:] == []
    ok = chat(http, [{"role": "user", "content": content[:MAX_IMAGES + 1]}])
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("side,words", [(12000, "pixels"), (20000, "--max-image-width")])
def test_a_decompression_bomb_is_refused_before_decoding(http, side, words):
    bomb = bomb_png(side)
    assert len(bomb) < MAX_BYTES
    r = chat(http, [image_message(data_uri(bomb))])
    reason = assert_refused(r, "messages[0].content[1]")
    assert words in reason, reason
    assert_serving(http)


def test_a_corrupt_png_is_refused(http):
    good = png(9)
    for broken in (good[: len(good) // 2], good[:40] + bytes(len(good) - 40)):
        r = chat(http, [image_message(data_uri(broken))])
        assert_refused(r, "messages[0].content[1]")
    r = chat(http, [image_message(data_uri(b"plain text, not an image"))])
    assert_refused(r, "messages[0].content[1]")


def test_an_image_the_processor_refuses_is_a_400_naming_the_part(http):
    wide = io.BytesIO()
    Image.new("RGB", (3000, 10)).save(wide, "PNG")  # Qwen-VL's bound: sides 200x apart
    r = chat(http, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(png(11))}},
        {"type": "image_url", "image_url": {"url": data_uri(wide.getvalue())}},
        {"type": "text", "text": QUESTION}]}])
    reason = assert_refused(r, "messages[0].content[1]")
    assert "aspect ratio" in reason, reason
    assert_serving(http)


def test_a_wrong_mime_type_in_a_data_uri_names_the_part(http):
    r = chat(http, [image_message(data_uri(png(10), "image/jpeg"))])
    reason = assert_refused(r, "messages[0].content[1]")
    assert "image/jpeg" in reason and "image/png" in reason, reason


# --- 6. a text-only model ----------------------------------------------------------------------


def test_a_text_only_model_answers_501_and_fetches_nothing(text_server, hosts):
    canary = f"http://127.0.0.1:{hosts['canary'].port}/x.png"
    with httpx.Client(base_url=text_server.base_url, timeout=60, trust_env=False) as c:
        r = c.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 4, "messages": [image_message(canary)]})
        reason = assert_refused(r, "messages[0].content[1]", status=501,
                                kind="not_supported_error", hidden=["127.0.0.1"])
        assert "image input is not supported" in reason, reason
        assert canary_hits(hosts) == []
        assert c.get("/health").status_code == 200


# --- 7. the batch and the prompt cache ---------------------------------------------------------


TEXT_TOKENS = 512  # the text rows outlive the image rows: these decode beside them


def _greedy(http, content, **extra) -> tuple[str, list[float]]:
    r = chat(http, [{"role": "user", "content": content}], max_tokens=16, logprobs=True,
             cache_prompt=False, **extra)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    tokens = choice["logprobs"]["content"]
    assert len(tokens) == 16
    return choice["message"]["content"], [t["logprob"] for t in tokens]


class TextRow(threading.Thread):
    """A streamed greedy text request of TEXT_TOKENS tokens: ``started`` is set at its
    first token, ``ended`` is the time its stream closed."""

    def __init__(self, base_url: str, text: str):
        super().__init__()
        self.base_url, self.text = base_url, text
        self.started = threading.Event()
        self.content, self.logprobs, self.ended = "", [], 0.0

    def run(self):
        # no drafting: prompt lookup would race a text row through its tokens (random
        # weights repeat themselves) while no image row has joined yet
        body = {"model": "vlm", "messages": [{"role": "user", "content": self.text}],
                "max_tokens": TEXT_TOKENS, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False, "logprobs": True, "stream": True,
                "speculative.n_max": 0}
        try:
            with httpx.Client(base_url=self.base_url, timeout=120, trust_env=False) as c, \
                    c.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    for choice in json.loads(line[6:])["choices"]:
                        self.content += choice["delta"].get("content") or ""
                        self.logprobs += [t["logprob"] for t in
                                          (choice.get("logprobs") or {}).get("content") or []]
                        self.started.set()
        finally:
            self.ended = time.perf_counter()
            self.started.set()


def test_image_rows_batched_equal_solo(http):
    """Two image rows of 16 tokens sent while three long text rows decode (--parallel 4:
    one image row joins the three at once, the other when a slot frees): each row's greedy
    tokens and log-probabilities are those it has alone."""
    images = [[{"type": "image_url", "image_url": {"url": data_uri(png(31))}},
               {"type": "text", "text": QUESTION}],
              [{"type": "text", "text": "And this?"},
               {"type": "image_url", "image_url": {"url": data_uri(png(32))}}]]
    texts = [f"Tell me about topic {i} in some words." for i in range(3)]
    solo_images = [_greedy(http, content) for content in images]
    solo_texts = []
    for text in texts:
        row = TextRow(http.base_url, text)
        row.run()
        solo_texts.append((row.content, row.logprobs))
    assert solo_images[0] != solo_images[1]  # two images: two different rows

    rows = [TextRow(http.base_url, text) for text in texts]
    for row in rows:
        row.start()
    try:
        for row in rows:
            assert row.started.wait(60)
        barrier = threading.Barrier(len(images))

        def image_row(content):
            barrier.wait()
            out = _greedy(http, content)
            return out, time.perf_counter()

        with ThreadPoolExecutor(len(images)) as pool:
            batched = list(pool.map(image_row, images))
    finally:
        for row in rows:
            row.join(120)
    # an image row began after the text rows and ended before any of them: it decoded
    # beside all three
    assert min(done for _, done in batched) < min(row.ended for row in rows)
    for (alone_text, alone_lp), (batch_text, batch_lp) in zip(
            [*solo_images, *solo_texts],
            [*(out for out, _ in batched), *((r.content, r.logprobs) for r in rows)],
            strict=True):
        assert batch_text == alone_text
        assert len(batch_lp) == len(alone_lp)
        np.testing.assert_allclose(batch_lp, alone_lp, atol=1e-3)


def _cached(http, data: bytes) -> tuple[int, int]:
    r = chat(http, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(data)}},
        {"type": "text", "text": LONG_QUESTION}]}])
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get(
        "cached_tokens", 0) or 0


def test_a_repeated_image_is_cached_and_a_different_one_is_not(http, expansion):
    seen, repeat = png(41), png(42)
    content = [{"type": "image"}, {"type": "text", "text": LONG_QUESTION}]
    first, end, length = expansion.image_span(content, [seen])
    prompt, cached = _cached(http, seen)
    assert prompt == length and cached <= first, (prompt, cached, first)
    prompt, cached = _cached(http, seen)
    assert end <= cached < prompt, (cached, end, prompt)  # past the whole image
    assert expansion.image_span(content, [repeat]) == (first, end, length)
    prompt, cached = _cached(http, repeat)
    assert cached <= first, (cached, first)  # stops before the image: no KV shared
    prompt, cached = _cached(http, repeat)
    assert end <= cached < prompt, (cached, end, prompt)
