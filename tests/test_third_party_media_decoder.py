"""A third party's media decoder, installed from a temporary directory, adds HEIC with no
core edit: its entry point registers it cheaply, core's registry picks it by the bytes,
its ``decode`` runs under the limits, and it passes ``check_media_decoder``.

The package is the tutorial's (``docs/tutorial/first-media-decoder.md``): its TOML and
Python blocks, in order, are the package's files (``package()``), so the two cannot drift.
Its decoder reads HEIC with pillow-heif; the test installs a stand-in ``pillow_heif``
beside it (``STAND_IN``), which reads this test's HEIC-shaped files and records what it
decoded, so the test runs offline and can tell whether a pixel was decoded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_third_party_plugin import _env, _install

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial" / "first-media-decoder.md"

# the tutorial's TOML and Python blocks, in order, are the package's files
FILES = ("pyproject.toml", "src/mlxcel_media_heic/plugin.py", "src/mlxcel_media_heic/decode.py")


def package() -> dict[str, str]:
    """The package, file by file, as the tutorial writes it (``FILES``)."""
    blocks = re.findall(r"^```(?:python|toml)\n(.*?)^```$", TUTORIAL.read_text(), re.M | re.S)
    assert len(blocks) == len(FILES), "the tutorial's code blocks are not the package's files"
    return {"src/mlxcel_media_heic/__init__.py": "", **dict(zip(FILES, blocks, strict=True))}


# reads b"....ftypheic", width and height (u16), raw RGB; records each size it decodes
STAND_IN = '''
import struct

from PIL import Image

DECODED = []


class HeifFile:
    def __init__(self, data):
        if data[4:8] != b"ftyp":
            raise ValueError("not a HEIF file")
        self.size = struct.unpack(">HH", data[12:16])
        self._pixels = data[16:]

    def to_pillow(self):
        DECODED.append(self.size)
        if len(self._pixels) != self.size[0] * self.size[1] * 3:
            raise ValueError("truncated")
        return Image.frombytes("RGB", self.size, self._pixels)


def open_heif(fp):
    return HeifFile(fp.read())
'''


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("third-party-heic")
    src = root / "mlxcel-media-heic"
    for name, text in package().items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    stand_in = root / "stand-in"
    stand_in.mkdir()
    (stand_in / "pillow_heif.py").write_text(STAND_IN)
    return [_install(src, root / "site"), stand_in]


CHECK = textwrap.dedent("""
    import json, struct, sys
    from mlxcel.plugins import load_plugins

    def heic(w, h, brand=b"heic", rgb=(200, 100, 50)):
        return b"\\0\\0\\0\\x18ftyp" + brand + struct.pack(">HH", w, h) + bytes(rgb) * (w * h)

    plugins = load_plugins()
    eager = sorted(m for m in ("mlxcel_media_heic.decode", "pillow_heif", "PIL")
                   if m in sys.modules)
    registry = plugins.media_decoders
    from mlxcel.errors import InvalidRequest
    from mlxcel.media.api import MediaLimits
    from mlxcel.media.decode import decode_media
    from mlxcel.testing.conformance import check_media_decoder
    from mlxcel.types.media import MediaBlob

    def run(data, mime):
        try:
            item = decode_media(MediaBlob.of(data, mime, "data"), "image", registry,
                                MediaLimits(), "messages[0].content[1]")
            return [item.width, item.height, list(item.image.getpixel((0, 0)))]
        except InvalidRequest as exc:
            return exc.message

    import pillow_heif
    out = {
        "eager": eager, "owner": registry.owner("heic"), "mimes": registry.mimes("image"),
        "photo": run(heic(3, 2), "image/heic"),
        "heif": run(heic(2, 2, b"mif1"), ""),
        "mislabelled": run(heic(3, 2), "image/jpeg"),
        "bomb": run(heic(60000, 60000, rgb=b""), "image/heic"),
        "decoded": list(map(list, pillow_heif.DECODED)),
    }
    check_media_decoder("heic", [heic(4, 3), (heic(5, 2, b"heix"), "image/heic")])
    print(json.dumps(out))
""")


def test_a_third_party_heic_decoder_is_registered_lazily_and_decodes(sites):
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          env=_env(sites), timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["eager"] == [], f"imported at registration: {out['eager']}"
    assert out["owner"] == "media-heic"
    assert {"image/heic", "image/heif", "image/png"} <= set(out["mimes"])
    assert out["photo"] == [3, 2, [200, 100, 50]] and out["heif"][:2] == [2, 2]
    assert "image/heic" in out["mislabelled"] and "image/jpeg" in out["mislabelled"]
    assert "--max-image-width" in out["bomb"], out["bomb"]
    assert out["decoded"] == [[3, 2], [2, 2]], "the bomb's pixels were decoded"


def test_the_plugin_listing_shows_the_decoder(sites):
    proc = subprocess.run([sys.executable, "-m", "mlxcel.cli", "plugins", "--json"],
                          capture_output=True, text=True, env=_env(sites), timeout=120)
    assert proc.returncode == 0, proc.stderr
    infos = {i["name"]: i for i in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert infos["media-heic"]["distribution"] == "mlxcel-media-heic"
    assert infos["media-heic"]["registers"] == {"media decoders": ["heic"]}
    assert infos["media-builtin"]["registers"] == {
        "media decoders": ["pillow", "miniaudio", "ffmpeg-audio"]}
    text = subprocess.run([sys.executable, "-m", "mlxcel.cli", "plugins"], capture_output=True,
                          text=True, env=_env(sites), timeout=120).stdout.splitlines()
    line = next(ln for ln in text if ln.startswith("media-heic"))
    assert f"\n    {line}\n" in TUTORIAL.read_text(), f"the tutorial does not show {line!r}"


def test_the_tutorial_writes_each_file_of_the_package_whole():
    files = package()
    assert 'media-heic = "mlxcel_media_heic.plugin"' in files["pyproject.toml"]
    assert "def mlxcel_register_media_decoders" in files["src/mlxcel_media_heic/plugin.py"]
    assert "def decode(blob, limits)" in files["src/mlxcel_media_heic/decode.py"]
    text = TUTORIAL.read_text()
    assert "check_media_decoder" in text and "media-heic" in text
