"""The media fetch policy for remote URLs (``mlxcel.media.fetch``): they reach public
addresses only (checked before connecting, on the connected peer and on every redirect),
within the size and time limits, and every refusal is a 400 naming the part without the
address. (Local files, data: URIs and the settings: test_media_sources.py.)

A canary HTTP server on loopback records every request it gets: the refusals leave its
list empty, and the same URLs with ``allow_private`` reach it (so an empty list means the
policy refused, not that the URL was unreachable). A "public" host is simulated by
patching the guard's resolver and dialer, never by a real network.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from urllib.parse import quote

import httpcore
import pytest
from mlxcel.errors import InvalidRequest
from mlxcel.media import addresses
from mlxcel.media.addresses import is_public
from mlxcel.media.fetch import FetchPolicy, fetch
from mlxcel.testing.media_hosts import RecordingHandler, loopback_hosts, public_host_seams

PART = "messages[0].content[1]"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
PUBLIC_IP = "93.184.216.34"  # a public address no test ever reaches: dials to it are patched
SECRET = b"TOP-SECRET-CONTENTS"


class Handler(RecordingHandler):
    def route(self, url):
        if url.path == "/x.png":
            self.send(200, PNG, Content_Type="image/png; charset=binary")
        elif url.path.startswith("/r/"):  # /r/N: N redirects, then the image
            left = int(url.path[3:])
            if left:
                self.send(302, Location=f"/r/{left - 1}")
            else:
                self.send(200, PNG, Content_Type="image/png")
        elif url.path == "/endless":  # no Content-Length: a body that never ends
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            deadline = time.monotonic() + 10
            try:
                while time.monotonic() < deadline:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass
        elif url.path == "/liar":  # a Content-Length over the limit, then nothing
            self.send_response(200)
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
            self.wfile.write(b"\0" * 16)
            self.wfile.flush()
            time.sleep(5)
        elif url.path == "/slow":
            time.sleep(3)
            self.send(200, PNG, Content_Type="image/png")
        elif url.path == "/gzip":
            self.send(200, PNG, Content_Type="image/png", Content_Encoding="gzip")
        else:
            super().route(url)  # /to?u=: a redirect to u; else 404


@pytest.fixture(scope="module")
def servers():
    """``canary`` (the private target), ``origin`` (the simulated public host) and, where
    the machine has IPv6 loopback, ``canary6`` on ::1."""
    with loopback_hosts(Handler) as made:
        yield made


@pytest.fixture
def canary(servers):
    servers["canary"].hits.clear()
    if servers["canary6"] is not None:
        servers["canary6"].hits.clear()
    return servers["canary"]


@pytest.fixture
def dialed(monkeypatch):
    """Every (address, port) the guard dials, the dial itself unchanged."""
    seen: list[tuple[str, int]] = []
    real = addresses.open_tcp

    async def recording(ip, port, timeout):
        seen.append((ip, port))
        return await real(ip, port, timeout)

    monkeypatch.setattr(addresses, "open_tcp", recording)
    return seen


class Origin:
    url: str  # the simulated public host's base URL
    dialed: list  # every (address, port) the guard dialed


@pytest.fixture
def public_origin(monkeypatch, servers):
    """``media.example`` resolves to PUBLIC_IP, and a dial to PUBLIC_IP reaches the origin
    server on loopback while reporting PUBLIC_IP as its peer; other names resolve and
    dial as usual."""
    origin, made = servers["origin"], Origin()
    origin.hits.clear()
    made.url, made.dialed = f"http://media.example:{origin.port}", []
    resolve, open_tcp = public_host_seams("media.example", PUBLIC_IP, origin.port,
                                          made.dialed)
    monkeypatch.setattr(addresses, "resolve", resolve)
    monkeypatch.setattr(addresses, "open_tcp", open_tcp)
    return made


def run(source, policy=None):
    return asyncio.run(fetch(source, policy or FetchPolicy(), PART))


def refused(source, policy=None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        run(source, policy)
    exc = info.value
    assert exc.status == 400 and exc.param == PART and exc.message.startswith(f"{PART}: ")
    return exc


def _loopback_urls(servers):
    port = servers["canary"].port
    six = servers["canary6"].port if servers["canary6"] is not None else port
    return {
        "v4": f"http://127.0.0.1:{port}/x.png",
        "name": f"http://localhost:{port}/x.png",
        "name-dot": f"http://LOCALHOST.:{port}/x.png",
        "v6": f"http://[::1]:{six}/x.png",
        "mapped": f"http://[::ffff:127.0.0.1]:{port}/x.png",
        "decimal": f"http://2130706433:{port}/x.png",
        "octal": f"http://017700000001:{port}/x.png",
        "hex": f"http://0x7f.1:{port}/x.png",
        "short": f"http://127.1:{port}/x.png",
        "unspecified": f"http://0.0.0.0:{port}/x.png",
        "https": f"https://127.0.0.1:{port}/x.png",
    }


# --- the address rule -------------------------------------------------------------------


@pytest.mark.parametrize("address,public", [
    ("8.8.8.8", True), ("93.184.216.34", True), ("2606:4700:4700::1111", True),
    ("64:ff9b::808:808", True),  # NAT64 of a public address
    ("127.0.0.1", False), ("127.8.9.10", False), ("10.1.2.3", False), ("172.16.5.4", False),
    ("192.168.1.1", False), ("169.254.169.254", False), ("100.64.0.1", False),
    ("0.0.0.0", False), ("255.255.255.255", False), ("224.0.0.1", False),
    ("192.0.2.1", False), ("198.18.0.1", False), ("240.0.0.1", False),
    ("::1", False), ("::", False), ("fe80::1", False), ("fc00::1", False),
    ("fd12:3456::1", False), ("fec0::1", False), ("ff02::1", False),
    ("::ffff:127.0.0.1", False), ("::ffff:169.254.169.254", False),
    ("::ffff:10.0.0.1", False), ("::127.0.0.1", False), ("64:ff9b::7f00:1", False),
    ("2002:7f00:1::1", False), ("2002:a9fe:a9fe::1", False),  # 6to4 of 127/8, metadata
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo of 127.0.0.1
    ("2001:db8::1", False),
])
def test_public_addresses_are_only_the_globally_routed_ones(address, public):
    assert is_public(addresses.ip_address(address)) is public


# --- remote URLs without allow_private: refused, the canary untouched ---------------------


@pytest.mark.parametrize("kind", ["v4", "name", "name-dot", "v6", "mapped", "decimal",
                                  "octal", "hex", "short", "unspecified", "https"])
def test_a_url_that_reaches_this_machine_is_refused_before_connecting(servers, canary,
                                                                     dialed, kind):
    exc = refused(_loopback_urls(servers)[kind])
    assert "non-public address" in exc.message
    assert "127.0.0.1" not in exc.message and "::1" not in exc.message
    assert dialed == [] and canary.hits == []
    assert servers["canary6"] is None or servers["canary6"].hits == []


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/",
                                 "http://[fe80::1]/", "http://10.0.0.1/x.png",
                                 "http://100.64.0.1/x.png", "http://[fd00::1]:8080/"])
def test_private_metadata_and_link_local_urls_are_refused_before_connecting(dialed, url):
    exc = refused(url)
    assert "non-public address" in exc.message and "169.254" not in exc.message
    assert dialed == []


@pytest.mark.parametrize("kind", ["v4", "name", "v6", "mapped", "decimal", "octal", "hex",
                                  "short", "unspecified"])
def test_the_same_urls_reach_the_canary_with_allow_private(servers, canary, kind):
    """The control: the URLs above do reach the canary once the policy allows it."""
    if kind == "v6" and servers["canary6"] is None:
        pytest.skip("no IPv6 loopback here")
    blob = run(_loopback_urls(servers)[kind], FetchPolicy(allow_private=True))
    assert blob.data == PNG
    target = servers["canary6"] if kind == "v6" else canary
    assert target.hits == ["/x.png"]


def test_a_simulated_public_host_is_fetched_without_allow_private(public_origin):
    """The control of the redirect tests: the simulated host itself passes the guard."""
    blob = run(f"{public_origin.url}/x.png")
    assert blob.data == PNG and blob.source == "http"
    assert public_origin.dialed == [(PUBLIC_IP, int(public_origin.url.rsplit(":", 1)[1]))]


@pytest.mark.parametrize("target", ["http://127.0.0.1:{port}/x.png",
                                    "http://localhost:{port}/x.png",
                                    "http://[::ffff:127.0.0.1]:{port}/x.png",
                                    "http://169.254.169.254/latest/meta-data/"])
def test_a_redirect_from_a_public_host_into_a_private_address_is_refused(
        servers, canary, public_origin, target):
    location = quote(target.format(port=canary.port), safe="")
    exc = refused(f"{public_origin.url}/to?u={location}")
    assert "non-public address" in exc.message and "127.0.0.1" not in exc.message
    assert len(servers["origin"].hits) == 1 and canary.hits == []
    assert [ip for ip, _ in public_origin.dialed] == [PUBLIC_IP]


def test_the_same_redirect_reaches_the_canary_with_allow_private(canary, public_origin):
    location = quote(f"http://127.0.0.1:{canary.port}/x.png", safe="")
    policy = FetchPolicy(allow_private=True)
    assert run(f"{public_origin.url}/to?u={location}", policy).data == PNG
    assert canary.hits == ["/x.png"]


def test_dns_that_changes_after_the_check_cannot_redirect_the_connection(monkeypatch, canary):
    """The name resolves to a public address when checked and to 127.0.0.1 afterwards:
    the guard resolves once and dials the address it checked."""
    answers = [[PUBLIC_IP]]
    calls, seen = [], []

    async def resolve(host, port):
        calls.append(host)
        return [addresses.ip_address(a) for a in (answers.pop() if answers else ["127.0.0.1"])]

    async def open_tcp(ip, port, timeout):
        seen.append((ip, port))
        raise httpcore.ConnectError("unreachable in this test")

    monkeypatch.setattr(addresses, "resolve", resolve)
    monkeypatch.setattr(addresses, "open_tcp", open_tcp)
    exc = refused(f"http://rebind.example:{canary.port}/x.png")
    assert calls == ["rebind.example"] and seen == [(PUBLIC_IP, canary.port)]
    assert PUBLIC_IP not in exc.message and "127.0.0.1" not in exc.message
    assert canary.hits == []


def test_a_name_with_any_non_public_address_is_refused(monkeypatch, dialed):
    """Round-robin DNS that mixes a private address in: refused, not dialed in part."""
    async def resolve(host, port):
        return [addresses.ip_address(a) for a in (PUBLIC_IP, "127.0.0.1")]

    monkeypatch.setattr(addresses, "resolve", resolve)
    exc = refused("http://mixed.example/x.png")
    assert "non-public address" in exc.message and PUBLIC_IP not in exc.message
    assert dialed == []


@pytest.mark.parametrize("host", ["localhost", "LocalHost.", "media.localhost"])
def test_localhost_names_are_refused_whatever_the_resolver_says(monkeypatch, dialed, host):
    async def resolve(host, port):
        return [addresses.ip_address(PUBLIC_IP)]

    monkeypatch.setattr(addresses, "resolve", resolve)
    assert "non-public address" in refused(f"http://{host}/x.png").message
    assert dialed == []


def test_a_connected_peer_that_is_not_public_is_refused_before_the_request(monkeypatch,
                                                                          canary):
    """The check after connecting: the name resolved to a public address, but the socket
    ended up at the canary (a path the resolver does not see); no request is sent."""
    real_open = addresses.open_tcp

    async def resolve(host, port):
        return [addresses.ip_address(PUBLIC_IP)]

    async def open_tcp(ip, port, timeout):
        return await real_open("127.0.0.1", canary.port, timeout)

    monkeypatch.setattr(addresses, "resolve", resolve)
    monkeypatch.setattr(addresses, "open_tcp", open_tcp)
    exc = refused(f"http://peer.example:{canary.port}/x.png")
    assert "non-public address" in exc.message and "127.0.0.1" not in exc.message
    time.sleep(0.2)  # give the canary time to record a request, were one sent
    assert canary.hits == []


def test_a_redirect_to_a_local_file_is_refused(canary, tmp_path):
    (tmp_path / "x.png").write_bytes(SECRET)
    location = quote((tmp_path / "x.png").as_uri(), safe="")
    policy = FetchPolicy(allow_private=True, media_paths=(tmp_path.resolve(),))
    exc = refused(f"http://127.0.0.1:{canary.port}/to?u={location}", policy)
    assert "not http(s)" in exc.message and str(tmp_path) not in exc.message


# --- remote URLs with allow_private: the fetch and its limits ---------------------------


def test_a_fetch_gives_the_bytes_the_mime_type_and_the_digest(canary):
    blob = run(f"http://127.0.0.1:{canary.port}/x.png", FetchPolicy(allow_private=True))
    assert blob.data == PNG and blob.mime == "image/png" and blob.source == "http"
    assert blob.digest == hashlib.sha256(PNG).digest()
    assert "127.0.0.1" not in repr(blob) and repr(PNG[:12]) not in repr(blob)


def test_five_redirects_are_followed_and_a_sixth_is_refused(canary):
    policy = FetchPolicy(allow_private=True)
    assert run(f"http://127.0.0.1:{canary.port}/r/5", policy).data == PNG
    assert canary.hits == ["/r/5", "/r/4", "/r/3", "/r/2", "/r/1", "/r/0"]
    canary.hits.clear()
    exc = refused(f"http://127.0.0.1:{canary.port}/r/6", policy)
    assert "more than 5" in exc.message
    assert canary.hits == ["/r/6", "/r/5", "/r/4", "/r/3", "/r/2", "/r/1"]


def test_a_body_over_the_limit_is_refused_while_streaming(canary):
    start = time.monotonic()
    exc = refused(f"http://127.0.0.1:{canary.port}/endless",
                  FetchPolicy(allow_private=True, max_bytes=100_000, timeout_s=5))
    assert "larger than --max-image-payload-size (100000 bytes)" in exc.message
    assert time.monotonic() - start < 3  # stopped at the limit, not at the timeout


def test_a_content_length_over_the_limit_is_refused_without_reading(canary):
    start = time.monotonic()
    exc = refused(f"http://127.0.0.1:{canary.port}/liar",
                  FetchPolicy(allow_private=True, max_bytes=1 << 20, timeout_s=4))
    assert "larger than --max-image-payload-size (1048576 bytes)" in exc.message
    assert time.monotonic() - start < 2  # the body (which never comes) was not awaited


def test_a_slow_server_hits_the_timeout(canary):
    start = time.monotonic()
    exc = refused(f"http://127.0.0.1:{canary.port}/slow",
                  FetchPolicy(allow_private=True, timeout_s=0.5))
    assert "longer than 0.5 s" in exc.message
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("path,reason", [("/missing", "HTTP 404"),
                                         ("/gzip", "compressed body")])
def test_a_non_2xx_status_or_an_encoded_body_is_refused(canary, path, reason):
    exc = refused(f"http://127.0.0.1:{canary.port}{path}", FetchPolicy(allow_private=True))
    assert reason in exc.message
