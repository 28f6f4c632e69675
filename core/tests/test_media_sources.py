"""The media fetch policy for sources on this machine (``mlxcel.media.fetch``): local
files only under a ``--media-path`` root once symlinks are resolved, ``data:`` URIs and
raw base64 within the size limit, and the policy as the flags and env twins set it. Every
refusal is a 400 naming the part, without the path or the bytes. (Remote URLs:
test_media_fetch.py.)
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from mlxcel.errors import InvalidRequest
from mlxcel.media.fetch import FetchPolicy, blob_from_base64
from mlxcel.options import build_parser
from mlxcel.settings import Settings
from test_media_fetch import PART, refused, run

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
SECRET = b"TOP-SECRET-CONTENTS"


# --- local files ------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    """root/ (the media path) with a.png, a b.png, a symlink to a file outside, a
    symlinked directory outside, and a FIFO; outside/ with a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "a.png").write_bytes(PNG)
    (root / "a b.png").write_bytes(PNG)
    (outside / "secret.png").write_bytes(SECRET)
    (root / "link.png").symlink_to(outside / "secret.png")
    (root / "dir").symlink_to(outside, target_is_directory=True)
    (root / "inner").symlink_to(root / "a.png")
    os.mkfifo(root / "fifo.png")
    return root, outside, FetchPolicy(media_paths=(root.resolve(),))


def _no_leak(exc, *paths):
    for path in paths:
        assert str(path) not in exc.message and str(Path(path).resolve()) not in exc.message
    assert SECRET.decode() not in exc.message


def test_a_file_under_the_root_is_read_as_a_bare_path_and_as_a_file_url(tree):
    root, _, policy = tree
    for source in (str(root / "a.png"), (root / "a.png").as_uri(),
                   (root / "a b.png").as_uri(), str(root / "inner")):
        blob = run(source, policy)
        assert blob.data == PNG and blob.source == "file"
        assert blob.digest == hashlib.sha256(PNG).digest()
    assert run(str(root / "a.png"), policy).mime == "image/png"


def test_a_file_outside_the_root_is_refused(tree):
    _, outside, policy = tree
    for source in (str(outside / "secret.png"), (outside / "secret.png").as_uri()):
        exc = refused(source, policy)
        assert "outside the allowed media paths" in exc.message
        _no_leak(exc, outside / "secret.png")


def test_dot_dot_is_refused_even_when_it_would_land_inside(tree):
    root, outside, policy = tree
    for source in (f"{root}/../outside/secret.png", f"{root}/../root/a.png",
                   f"file://{quote(str(root))}/%2e%2e/outside/secret.png"):
        exc = refused(source, policy)
        assert "'..'" in exc.message
        _no_leak(exc, outside / "secret.png")


def test_a_symlink_inside_the_root_that_leads_out_is_refused(tree):
    root, outside, policy = tree
    for source in (str(root / "link.png"), str(root / "dir" / "secret.png")):
        exc = refused(source, policy)
        assert "outside the allowed media paths" in exc.message
        _no_leak(exc, outside / "secret.png", root / "link.png")


def test_without_a_media_path_every_local_file_is_refused(tree):
    root, _, _ = tree
    for source in (str(root / "a.png"), (root / "a.png").as_uri()):
        assert "no --media-path" in refused(source, FetchPolicy()).message


@pytest.mark.parametrize("source", ["a.png", "root/a.png", "./a.png", "~/a.png"])
def test_a_relative_path_is_refused(tree, source, monkeypatch):
    root, _, policy = tree
    monkeypatch.chdir(root)
    assert "relative path" in refused(source, policy).message


def test_a_fifo_a_missing_file_and_a_remote_file_url_are_refused(tree):
    root, outside, policy = tree
    start = time.monotonic()
    assert "not a regular file" in refused(str(root / "fifo.png"), policy).message
    assert time.monotonic() - start < 2  # opening the FIFO did not wait for a writer
    assert "does not exist" in refused(str(root / "nothing.png"), policy).message
    # a missing file outside the roots says "outside": no probing of the disk
    assert "outside" in refused(str(outside / "nothing.png"), policy).message
    assert "file:///" in refused(f"file://otherhost{root}/a.png", policy).message


def test_a_file_over_the_limit_is_refused(tree):
    root, _, _ = tree
    policy = FetchPolicy(media_paths=(root.resolve(),), max_bytes=len(PNG) - 1)
    exc = refused(str(root / "a.png"), policy)
    assert f"larger than --max-image-payload-size ({len(PNG) - 1} bytes)" in exc.message
    assert run(str(root / "a.png"), FetchPolicy(media_paths=policy.media_paths,
                                                max_bytes=len(PNG))).data == PNG


# --- data: URIs and base64 --------------------------------------------------------------


def test_a_base64_data_uri_decodes_with_its_mime_type():
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    blob = run(uri)
    assert blob.data == PNG and blob.mime == "image/png" and blob.source == "data"
    assert blob.digest == hashlib.sha256(PNG).digest()
    wrapped = "data:IMAGE/PNG;name=x.png;base64," + base64.encodebytes(PNG).decode()
    assert run(wrapped).data == PNG and run(wrapped).mime == "image/png"


def test_a_large_inline_source_sent_again_is_not_decoded_again(monkeypatch):
    """Agents re-send the conversation's images every turn: the same text gives the
    same blob without a second decode, for data: URIs and raw base64 alike."""
    from mlxcel.media import fetch as fetch_mod

    decodes = []
    real = fetch_mod._b64decode
    monkeypatch.setattr(fetch_mod, "_b64decode",
                        lambda *a: (decodes.append(1), real(*a))[1])
    data = PNG + os.urandom(fetch_mod.INLINE_MEMO_MIN)  # this test's own bytes
    text = base64.b64encode(data).decode()
    uri = "data:image/png;base64," + text
    first = run(uri)
    again = run("".join(list(uri)))  # an equal string, not the same object
    assert again == first and again.data == data and len(decodes) == 1
    assert again.digest == hashlib.sha256(data).digest()
    # raw base64 (Anthropic's source) is keyed with its declared type
    png = blob_from_base64(text, "image/png", PART, max_bytes=1 << 20)
    jpeg = blob_from_base64(text, "image/jpeg", PART, max_bytes=1 << 20)
    assert png.mime == "image/png" and jpeg.mime == "image/jpeg" and len(decodes) == 3
    assert blob_from_base64(text, "image/png", PART, max_bytes=1 << 20) == png
    assert len(decodes) == 3
    # a small source is decoded each time (not worth a memo entry)
    small = "data:image/png;base64," + base64.b64encode(PNG).decode()
    run(small), run(small)
    assert len(decodes) == 5


def test_the_inline_memo_never_lets_a_source_past_the_policy():
    """A refusal is not remembered, and a text that passed under one size limit is
    refused under a smaller one."""
    from mlxcel.media import fetch as fetch_mod

    data = PNG + os.urandom(fetch_mod.INLINE_MEMO_MIN)
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    assert run(uri, FetchPolicy(max_bytes=1 << 20)).data == data
    exc = refused(uri, FetchPolicy(max_bytes=len(data) - 1))
    assert "--max-image-payload-size" in exc.message
    bad = uri[:-8] + "@@@@@@@@"  # as long, not base64
    for _ in range(2):
        assert "not valid" in refused(bad).message


def test_a_percent_encoded_data_uri_decodes():
    blob = run("data:image/svg+xml,%3Csvg%20xmlns%3D%22x%22%2F%3E")
    assert blob.data == b'<svg xmlns="x"/>' and blob.mime == "image/svg+xml"
    assert run("data:,plain%20text").mime == "text/plain"


@pytest.mark.parametrize("uri", ["data:image/png;base64,@@not*base64@@",
                                 "data:image/png;base64,QUJD=RA==",
                                 "data:image/png;base64,A",
                                 "data:image/png;base64"])
def test_a_broken_data_uri_is_a_400(uri):
    exc = refused(uri)
    assert "not*base64" not in exc.message


def test_a_data_uri_over_the_limit_is_refused():
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    exc = refused(uri, FetchPolicy(max_bytes=100))
    assert "larger than --max-image-payload-size (100 bytes)" in exc.message
    exc = refused("data:text/plain," + "a" * 101, FetchPolicy(max_bytes=100))
    assert "(100 bytes)" in exc.message


def test_raw_base64_becomes_a_blob_and_a_broken_one_is_a_400():
    blob = blob_from_base64(base64.b64encode(PNG).decode(), "image/png", PART)
    assert blob.data == PNG and blob.mime == "image/png" and blob.source == "data"
    with pytest.raises(InvalidRequest) as info:
        blob_from_base64("%%% nope", "image/png", PART)
    assert info.value.param == PART and PART in info.value.message
    with pytest.raises(InvalidRequest, match="larger than"):
        blob_from_base64(base64.b64encode(PNG).decode(), "image/png", PART, max_bytes=10)


@pytest.mark.parametrize("source", ["ftp://example.com/x.png", "gopher://x/", "C:\\x.png"])
def test_other_schemes_are_refused(source):
    assert "must be a data: URI" in refused(source).message


# --- the policy from the settings -------------------------------------------------------


def _settings(argv):
    return Settings(**vars(build_parser().parse_args(argv)))


def test_the_policy_comes_from_the_flags_and_their_env_twins(monkeypatch, tmp_path):
    for env in ("MLXCEL_MEDIA_PATH", "MLXCEL_ALLOW_PRIVATE_MEDIA_URLS",
                "LLAMA_ARG_MAX_IMAGE_PAYLOAD_SIZE"):
        monkeypatch.delenv(env, raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a", target_is_directory=True)
    (tmp_path / "c").mkdir()
    default = FetchPolicy.from_settings(_settings([]))
    assert default == FetchPolicy(media_paths=(), allow_private=False, max_bytes=64 << 20)
    settings = _settings(["--media-path", f"{tmp_path / 'b'}, {tmp_path / 'c'}",
                          "--max-image-payload-size", "1M"])
    policy = FetchPolicy.from_settings(settings)
    assert policy.media_paths == ((tmp_path / "a").resolve(), (tmp_path / "c").resolve())
    assert policy.max_bytes == 1 << 20 and policy.allow_private is False
    monkeypatch.setenv("MLXCEL_ALLOW_PRIVATE_MEDIA_URLS", "1")
    monkeypatch.setenv("MLXCEL_MEDIA_PATH", str(tmp_path / "c"))
    policy = FetchPolicy.from_settings(_settings([]))
    assert policy.allow_private is True
    assert policy.media_paths == ((tmp_path / "c").resolve(),)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--media-path", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-images", "0"])
