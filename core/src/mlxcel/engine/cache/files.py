"""Entry files of the prompt cache's disk tier: per entry a safetensors data file and a JSON
header (``FileHeader``), both named by ``entry_key``.

* The data file holds the entry's arrays, named by where they sit (``p.3.1``: payload layer
  3, state item 1; ``c.0.3.1``: checkpoint 0, layer 3, item 1), and under ``META_KEY`` a
  JSON tree that rebuilds the cache objects around them (class name + ``state`` ->
  ``from_state``, as mlx-lm's ``save_prompt_cache``). Only cache classes defined in
  ``mlx_lm.models.cache`` are written or rebuilt: a file never makes us import or
  instantiate anything else.
* Each file is written under a temporary name, fsynced and renamed, the header last: a data
  file without a valid header (a crash between the two) is garbage that ``scan`` deletes.
* A header binds its data by size and checksum (``checksum``), its tokens by its key, the
  model by its fingerprint (``model_fingerprint``): a cache read for other weights or from
  a torn file decodes to plausible garbage rather than failing, so all are checked before
  parsing. The checksum is CRC-32 per chunk (``mlxcel.engine.cache.checksums``), checked
  by several threads while the tensors load: it guards against torn, truncated and
  corrupted files, which is all a digest stored beside its file can do (whoever can
  rewrite the data can rewrite its header), and it runs at memory speed on every core, so
  a hit's load from disk is not spent hashing.
* A hit's arrays are read by MLX's own load, or on CUDA by several threads
  (``mlxcel.model.safetensors_reads``; the caller says how many).

No locking: the caller runs ``scan`` and ``clear`` while no write to the directory runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import msgspec
from mlx_lm.models import cache as lm_cache

from mlxcel.engine.cache import checksums
from mlxcel.engine.cache.entries import BLOCK_SIZE, block_hashes
from mlxcel.engine.cache.kinds import Checkpoint, RowCaches
from mlxcel.engine.cache.kvcache import KVRows
from mlxcel.model.safetensors_reads import read_weights

FORMAT = 1  # version of the metadata tree; another one is refused
META_KEY = "mlxcel.entry"
KINDS = ("rows", "kv")
_KEY = r"[0-9a-f]{64}"
_ENTRY = re.compile(rf"({_KEY})\.(safetensors|json)")
_TMP = re.compile(rf"({_KEY})\.(\d+)\.[0-9a-f]+\.tmp\.(safetensors|json)")
SAMPLES, SAMPLE_BYTES = 16, 64 * 1024  # model_fingerprint's reads of each weights file
MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
STALE_S = 600.0  # a temporary or header-less file this old is a crashed write


class FileRefused(ValueError):
    """An entry file that is not what we wrote for this model (``reason`` says how), or a
    payload that this format cannot store (a family's own cache class)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FileHeader(msgspec.Struct, frozen=True):
    key: str  # file stem: entry_key(tokens)
    tokens: tuple[int, ...]
    kind: str  # "rows" (a RowCaches payload) or "kv" (a KVRows payload)
    checkpoints: tuple[tuple[int, str], ...]  # (position, kind) of each Checkpoint, in order
    nbytes: int  # size of the data file
    checksum: str  # ``checksum`` of the data file's bytes
    fingerprint: str  # model_fingerprint of the model it was written for
    created: float  # time.time() at write


def entry_key(tokens: Sequence[int]) -> str:
    """sha256 hex of the last full block's hash, the length and the tokens past the last full
    block: one name per token sequence, and as cheap as the block hashes a lookup needs."""
    hashes = block_hashes(tokens)
    tail = tokens[len(hashes) * BLOCK_SIZE:]
    data = (hashes[-1] if hashes else b"") + len(tokens).to_bytes(8, "little") \
        + b"".join(int(t).to_bytes(4, "little") for t in tail)
    return hashlib.sha256(data).hexdigest()


# -- payload <-> arrays + JSON ------------------------------------------------------------
def _cache_class(name: Any) -> type | None:
    """The public cache class ``name`` of ``mlx_lm.models.cache``, else None."""
    if not isinstance(name, str) or name.startswith("_"):
        return None
    cls = getattr(lm_cache, name, None)
    ok = isinstance(cls, type) and issubclass(cls, lm_cache._BaseCache) \
        and cls.__module__ == lm_cache.__name__
    return cls if ok else None


def _encode(item: Any, name: str, arrays: dict[str, mx.array]) -> Any:
    """A state item as JSON: arrays become ``{"a": name}`` (stored in ``arrays``), lists
    and tuples lists, scalars and None themselves."""
    if isinstance(item, mx.array):
        arrays[name] = item
        return {"a": name}
    if item is None or isinstance(item, (bool, int, float, str)):
        return item
    if isinstance(item, (list, tuple)):
        return [_encode(x, f"{name}.{i}", arrays) for i, x in enumerate(item)]
    raise FileRefused(f"cannot store a {type(item).__name__} of a cache's state")


def _encode_cache(cache: Any, name: str, arrays: dict[str, mx.array]) -> Any:
    if cache is None:  # a checkpoint's layer that its entry gives
        return None
    cls = type(cache)
    if _cache_class(cls.__name__) is not cls:
        raise FileRefused(f"cannot store cache class {cls.__module__}.{cls.__qualname__}")
    if cls is lm_cache.CacheList:
        return {"cls": "CacheList", "caches": [_encode_cache(c, f"{name}.{i}", arrays)
                                               for i, c in enumerate(cache.caches)]}
    state = cache.state
    if cls is lm_cache.KVCache and cache.keys is not None and cache.keys.shape[2] > cache.offset:
        n = cache.offset  # a lone row's buffer has room past its tokens: not worth a write
        state = (cache.keys[..., :n, :], cache.values[..., :n, :], n)
    return {"cls": cls.__name__, "state": _encode(state, name, arrays)}


def _decode(item: Any, arrays: dict[str, mx.array]) -> Any:
    if isinstance(item, dict):
        return arrays[item["a"]]
    if isinstance(item, list):
        return [_decode(x, arrays) for x in item]
    return item


def _decode_cache(spec: Any, arrays: dict[str, mx.array]) -> Any:
    if spec is None:
        return None
    cls = _cache_class(spec["cls"])
    if cls is None:
        raise FileRefused(f"unknown cache class {str(spec['cls'])[:80]!r}")
    if cls is lm_cache.CacheList:
        return lm_cache.CacheList(*(_decode_cache(c, arrays) for c in spec["caches"]))
    return cls.from_state(_decode(spec["state"], arrays))


def _flatten(payload: Any, checkpoints: list[Checkpoint]) -> tuple[str, dict, str]:
    """(kind, arrays, metadata JSON) of an entry."""
    arrays: dict[str, mx.array] = {}
    if isinstance(payload, KVRows):
        kind, layers = "kv", _encode([payload.keys, payload.values], "p", arrays)
    elif isinstance(payload, RowCaches):
        kind = "rows"
        layers = [_encode_cache(c, f"p.{i}", arrays) for i, c in enumerate(payload.caches)]
    else:
        raise FileRefused(f"cannot store a {type(payload).__name__} payload")
    points = [[_encode_cache(c, f"c.{j}.{i}", arrays) for i, c in enumerate(cp.caches)]
              for j, cp in enumerate(checkpoints)]
    meta = {"format": FORMAT, "kind": kind, "payload": layers, "checkpoints": points}
    return kind, arrays, msgspec.json.encode(meta).decode()


def _rebuild(header: FileHeader, arrays: dict[str, mx.array],
             meta: dict[str, Any]) -> tuple[Any, list[Checkpoint]]:
    if meta.get("format") != FORMAT or meta.get("kind") != header.kind \
            or len(meta["checkpoints"]) != len(header.checkpoints):
        raise FileRefused("metadata does not match the header")
    mx.eval(list(arrays.values()))
    payload = KVRows(*_decode(meta["payload"], arrays)) if header.kind == "kv" \
        else RowCaches([_decode_cache(s, arrays) for s in meta["payload"]])
    points = []
    for (position, kind), specs in zip(header.checkpoints, meta["checkpoints"], strict=True):
        if header.kind == "rows" and len(specs) != len(payload.caches):
            raise FileRefused("a checkpoint's layers differ from the entry's")
        points.append(Checkpoint(position, kind, [_decode_cache(s, arrays) for s in specs]))
    return payload, points


# -- files ----------------------------------------------------------------------------------
def _paths(directory: Path, key: str) -> tuple[Path, Path]:
    return directory / f"{key}.safetensors", directory / f"{key}.json"


def checksum(data: bytes) -> str:
    """The header's checksum of a data file's bytes ``data``."""
    return checksums.data_checksum(data)


def _install(directory: Path, key: str, suffix: str, write: Any) -> tuple[int, str]:
    """``write(tmp)`` to ``<key>.<pid>.<random>.tmp.<suffix>``, fsync it, rename it to
    ``<key>.<suffix>``; the written file's size and ``checksum``."""
    tmp = directory / f"{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp.{suffix}"
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        done = checksums.file_checksum(tmp)
        os.replace(tmp, directory / f"{key}.{suffix}")
    finally:
        tmp.unlink(missing_ok=True)
    return done


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def write_entry(directory: Path, tokens: Sequence[int], payload: RowCaches | KVRows,
                checkpoints: list[Checkpoint], fingerprint: str) -> FileHeader:
    """Write an entry (module docstring: atomic, header last) and return its header; an entry
    of the same tokens is replaced. ``FileRefused`` before anything is written when the
    payload holds what the format cannot store; any ``OSError`` propagates."""
    key = entry_key(tokens)
    kind, arrays, meta = _flatten(payload, checkpoints)
    directory.mkdir(parents=True, exist_ok=True)
    _paths(directory, key)[1].unlink(missing_ok=True)  # an old header must not bind new data
    nbytes, checksum = _install(directory, key, "safetensors", lambda tmp: mx.save_safetensors(
        str(tmp), arrays, {META_KEY: meta}))
    header = FileHeader(key, tuple(int(t) for t in tokens), kind,
                        tuple((int(c.position), str(c.kind)) for c in checkpoints),
                        nbytes, checksum, fingerprint, time.time())
    _install(directory, key, "json", lambda tmp: tmp.write_bytes(msgspec.json.encode(header)))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return header


def _valid_header(directory: Path, key: str, fingerprint: str) -> FileHeader | None:
    data_path, header_path = _paths(directory, key)
    try:
        header = msgspec.json.decode(header_path.read_bytes(), type=FileHeader)
        ok = header.key == key and header.kind in KINDS and header.fingerprint == fingerprint \
            and header.checksum.startswith(checksums.scheme()) \
            and header.nbytes == data_path.stat().st_size and entry_key(header.tokens) == key
    except (OSError, ValueError, ArithmeticError, msgspec.MsgspecError):
        return None  # unreadable, not a header, or tokens that are not token ids
    return header if ok else None


def scan(directory: Path, fingerprint: str) -> list[FileHeader]:
    """Every valid header in ``directory``, oldest first. Deletes what cannot be used:
    headers that do not parse, name other tokens, or were written for another model, with
    their data; headers whose data file is missing or of another size; data files without
    a header; temporary files of other processes (a crashed write; ours may be in flight).
    The last two only once older than ``STALE_S``: another server on the same directory
    may be between its writes. Never raises for a bad file; an unreadable directory raises
    ``OSError``."""
    with os.scandir(directory) as it:
        names = {e.name for e in it}
    pid, found = str(os.getpid()), []
    for name in sorted(names):
        tmp, entry = _TMP.fullmatch(name), _ENTRY.fullmatch(name)
        if tmp is not None and tmp.group(2) != pid:
            if _stale(directory / name):
                _remove(directory / name)
        elif entry is None:
            continue
        elif entry.group(2) == "safetensors":
            if f"{entry.group(1)}.json" not in names and _stale(directory / name):
                _remove(directory / name)
        elif (header := _valid_header(directory, entry.group(1), fingerprint)) is not None:
            found.append(header)
        else:
            for path in _paths(directory, entry.group(1)):
                _remove(path)
    return sorted(found, key=lambda h: h.created)


def _stale(path: Path) -> bool:
    """Whether ``path`` was last written over ``STALE_S`` ago (gone: nothing to delete)."""
    try:
        return time.time() - path.stat().st_mtime > STALE_S
    except OSError:
        return False


def read_entry(directory: Path, header: FileHeader, fingerprint: str,
               threads: int = 1) -> tuple[RowCaches | KVRows, list[Checkpoint]]:
    """The entry's payload and checkpoints, their arrays computed: read by MLX's own load,
    or by ``threads`` threads when above 1. The header's key and the fingerprint are checked
    first, then the data file's size and checksum: the safetensors header's chunks before
    the file is parsed, the tensors' while they load (``checksums.verify_while``), so that
    no array is returned before every byte matched. On any mismatch or load error both
    files are deleted and ``FileRefused`` raised. Another ``OSError`` reading the file
    propagates."""
    data_path = directory / f"{header.key}.safetensors"
    try:
        if header.fingerprint != fingerprint or header.kind not in KINDS \
                or entry_key(header.tokens) != header.key:
            raise FileRefused("header of another model or of other tokens")
        try:
            arrays, metadata = checksums.verify_while(
                data_path, header.checksum, header.nbytes, _head(data_path),
                lambda: _load(data_path, threads))
            return _rebuild(header, arrays, msgspec.json.decode(metadata[META_KEY]))
        except FileNotFoundError:
            raise FileRefused("data file missing") from None
        except checksums.Mismatch:
            raise FileRefused("data file differs from its header") from None
        except (FileRefused, OSError):
            raise
        except Exception as e:  # the checksum held: a file we did not write this way
            raise FileRefused(f"cannot load: {type(e).__name__}") from e
    except FileRefused:
        delete(directory, header)
        raise


def _head(path: Path) -> int:
    """Bytes before a safetensors file's tensors: its length field and its JSON header."""
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def _load(path: Path, threads: int) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The file's arrays, evaluated by MLX's load or by ``threads`` threads, and its
    metadata."""
    arrays, metadata = mx.load(str(path), return_metadata=True)
    if threads > 1:
        return read_weights([path], threads, {path: arrays}), metadata
    mx.eval(list(arrays.values()))
    return arrays, metadata


def delete(directory: Path, header: FileHeader) -> None:
    """Remove an entry's files (the header first: the entry vanishes at once); missing files
    are fine."""
    data_path, header_path = _paths(directory, header.key)
    header_path.unlink(missing_ok=True)
    data_path.unlink(missing_ok=True)


def clear(directory: Path) -> tuple[int, int]:
    """Remove every file of this module's naming in ``directory`` (headers, data, temporary
    files; nothing else) and return (files removed, bytes freed); no directory: (0, 0)."""
    try:
        with os.scandir(directory) as it:
            entries = [e for e in it if _ENTRY.fullmatch(e.name) or _TMP.fullmatch(e.name)]
    except FileNotFoundError:
        return 0, 0
    removed = freed = 0
    for e in entries:
        with contextlib.suppress(FileNotFoundError):  # gone meanwhile: not ours to count
            size = e.stat(follow_symlinks=False).st_size
            os.unlink(e.path)
            removed, freed = removed + 1, freed + size
    return removed, freed


def _field(data: bytes) -> bytes:
    """``data`` prefixed by its length, so that fields hashed in a row cannot run together."""
    return len(data).to_bytes(8, "little") + data


def model_fingerprint(model_dir: Path, parts: dict[str, str]) -> str:
    """sha256 hex over config.json, each top-level ``*.safetensors`` file (by name: its name,
    size, safetensors header and ``SAMPLES`` evenly spaced chunks of ``SAMPLE_BYTES``) and
    the sorted ``parts``. The samples tell apart two checkpoints of the same shapes (a
    fine-tune, other random weights) without reading gigabytes at every start."""
    digest = hashlib.sha256(_field((model_dir / "config.json").read_bytes()))
    for path in sorted(model_dir.glob("*.safetensors"), key=lambda p: p.name):
        size = path.stat().st_size
        digest.update(_field(path.name.encode()) + size.to_bytes(8, "little"))
        with open(path, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else 0
            digest.update(_field(head + f.read(min(length, MAX_HEADER))))
            last = max(size - SAMPLE_BYTES, 0)
            for offset in sorted({last * i // (SAMPLES - 1) for i in range(SAMPLES)}):
                f.seek(offset)
                digest.update(f.read(SAMPLE_BYTES))
    for name, value in sorted(parts.items()):
        digest.update(_field(name.encode()) + _field(value.encode()))
    return digest.hexdigest()
