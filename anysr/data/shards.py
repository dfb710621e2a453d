"""Sharded data sets in object storage: WebDataset tar shards read by sample key through fsspec.

A shard set is a folder (local, ``file://``, ``s3://``, ``gs://``, ``http(s)://``) holding WebDataset-layout tar
shards (``shard-000000.tar`` ..., written by ``webdataset.TarWriter``: each sample is the members
``<key>.gt.<ext>`` and, for pairs, ``<key>.lq.<ext>``, next to each other) and ``index.json``: a wids shard index
(``__kind__: wids-shard-index-v1``, ``shardlist`` of ``{url, nsamples, filesize}``) whose shard entries also list
each sample's members as ``[offset, size, crc32]`` of the member's bytes in the tar. With those offsets a sample is
one byte-range read (``fs.cat_file(shard, start, end)``: one HTTP range request on S3, GCS or HTTP), so datasets
address shards by index exactly as they address a folder: the sampler's order, its position in the training state,
exact resume and the rank split are the same as for a folder.

``ShardBackend`` is the ``io_backend: {type: shards}`` file backend of one side (``gt`` or ``lq``) of a set.
A bounded local cache (``cache_dir``, ``cache_bytes``) keeps sample byte ranges on disk, least recently used out.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import posixpath
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anysr.data.file_backends import FileBackend, register_backend
from anysr.data.imageio import ImageInfo
from anysr.errors import DataError, did_you_mean

try:  # POSIX: several loader workers share one cache folder under an exclusive lock
    import fcntl
except ImportError:  # pragma: no cover - Windows: one process per cache folder
    fcntl = None  # type: ignore[assignment]

__all__ = ["INDEX_KIND", "INDEX_NAME", "ShardBackend", "ShardCache", "ShardSet", "index_url", "open_shard_set",
           "shard_options"]

INDEX_NAME = "index.json"
INDEX_KIND = "wids-shard-index-v1"
FIELDS = ("gt", "lq")
DEFAULT_CACHE_BYTES = 16 << 30  # io_backend.cache_bytes when cache_dir is set without it
FIX_INDEX = "write the set again with anysr prepare shards"


def import_fsspec() -> Any:
    """The fsspec module, or a DataError saying how to install it."""
    try:
        import fsspec  # noqa: PLC0415 - optional dependency (anysr[shards])
    except ImportError:
        raise DataError("io_backend type 'shards' needs fsspec: pip install anysr[shards] (fsspec, s3fs, "
                        "webdataset; gcsfs for gs://)") from None
    return fsspec


def index_url(root: str) -> str:
    """The index of a shard set named by ``root``: ``root`` itself when it ends in ``.json``, else
    ``root/index.json`` (a folder or URL prefix)."""
    return root if root.endswith(".json") else root.rstrip("/") + "/" + INDEX_NAME


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def url_filesystem(url: str, storage_options: Mapping[str, Any], *, who: str, verb: str,
                   options_key: str) -> tuple[Any, str]:
    """fsspec's file system and path of ``url``; a DataError starting with ``who`` when the scheme's package is
    missing or the file system refuses ``storage_options`` (named ``options_key``)."""
    fsspec = import_fsspec()
    try:
        return fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as exc:
        raise DataError(f"{who}: {verb} {_scheme(url)}:// needs {exc.name or 'a package'}: pip install "
                        "anysr[shards] (s3fs), or gcsfs for gs://") from None
    except (TypeError, ValueError) as exc:
        raise DataError(f"{who}: {options_key} are not accepted by the file system of {url} ({exc})") from None


def default_storage_options(url: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``given`` plus short timeouts for S3, so that an unreachable endpoint is an error within seconds."""
    opts = dict(given or {})
    if _scheme(url) in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", 5)
        config.setdefault("read_timeout", 60)
        config.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
        opts["config_kwargs"] = config
    return opts


def storage_errors() -> tuple[type[BaseException], ...]:
    """The exceptions an fsspec file system raises for an unreachable endpoint, missing or refused credentials or a
    failed transfer: OSError, and the client libraries' own bases where they are installed (botocore for s3fs,
    aiohttp for HTTP and gcsfs, google-auth for gcsfs's credentials)."""
    errors: list[type[BaseException]] = [OSError]
    for module, names in (("botocore.exceptions", ("BotoCoreError", "ClientError")), ("aiohttp", ("ClientError",)),
                          ("google.auth.exceptions", ("GoogleAuthError",))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        errors += [getattr(mod, name) for name in names if isinstance(getattr(mod, name, None), type)]
    return tuple(errors)


def credentials_hint(url: str) -> str:
    """What to check when ``url`` cannot be reached (its endpoint, credentials or server)."""
    return _credentials_hint(url)


def _credentials_hint(url: str) -> str:
    scheme = _scheme(url)
    if scheme in ("s3", "s3a"):
        return ("check the URL, io_backend.storage_options.endpoint_url and the credentials (AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY or an AWS profile)")
    if scheme in ("gs", "gcs"):
        return ("check the URL and the credentials (GOOGLE_APPLICATION_CREDENTIALS, or the VM's service account; "
                "io_backend.storage_options.token)")
    if scheme in ("http", "https"):
        return "check the URL and that the server is up"
    return "check the path"


@dataclass(frozen=True)
class _Sample:
    shard: int
    start: int  # byte span of the sample's members in its shard
    end: int
    members: Mapping[str, tuple[str, int, int, int]]  # field -> (member suffix 'gt.png', offset, size, crc32)
    headers: Mapping[str, ImageInfo]  # field -> what its image header says (from the index)


class ShardSet:
    """The index of one shard set and this process's file system handle to read it (opened lazily per process)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.root = root
        self.url = index_url(root)
        self.storage_options = default_storage_options(self.url, storage_options)
        self._fs: Any = None
        self._pid = -1
        self.recent: OrderedDict[str, bytes] = OrderedDict()  # the last samples read, by key (GT and LQ: one read)
        self._lock: threading.Lock | None = threading.Lock()
        self._lock_pid = os.getpid()
        fs, path = self._filesystem_and_path()
        try:
            raw = fs.cat_file(path)
        except FileNotFoundError:
            raise DataError(f"{self.url}: shard index not found; point dataroot_gt at a folder written by anysr "
                            "prepare shards (it holds index.json) or at its .json index") from None
        except Exception as exc:  # the file system's own errors (botocore, aiohttp, google-auth ...)
            raise DataError(f"{self.url}: cannot read the shard index ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); {_credentials_hint(self.url)}") from exc
        self.shards, self.samples, self.sizes = self._parse(raw, posixpath.dirname(path))

    def _filesystem_and_path(self) -> tuple[Any, str]:
        fs, path = url_filesystem(self.url, self.storage_options, who=self.url, verb="reading",
                                  options_key="io_backend.storage_options")
        self._fs, self._pid = fs, os.getpid()
        return fs, path

    @property
    def fs(self) -> Any:
        """This process's fsspec file system (a DataLoader worker opens its own)."""
        if self._fs is None or self._pid != os.getpid():
            self._filesystem_and_path()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"], state["_pid"], state["recent"], state["_lock"], state["_lock_pid"] = None, -1, OrderedDict(), \
            None, -1
        return state

    @property
    def lock(self) -> threading.Lock:
        """This process's lock of ``recent`` (threads of the start-up check read in parallel)."""
        if self._lock is None or self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
            self.recent = OrderedDict()
        return self._lock

    def _parse(self, raw: bytes, base: str) -> tuple[list[str], dict[str, _Sample], list[int]]:
        try:
            index = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{self.url}: not a JSON shard index ({exc}); {FIX_INDEX}") from None
        if not isinstance(index, dict) or not isinstance(index.get("shardlist"), list):
            raise DataError(f"{self.url}: not a wids shard index (no 'shardlist'); {FIX_INDEX}")
        shards: list[str] = []
        sizes: list[int] = []
        samples: dict[str, _Sample] = {}
        for n, entry in enumerate(index["shardlist"]):
            if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
                raise DataError(f"{self.url}: shardlist entry {n} has no 'url'; {FIX_INDEX}")
            listed = entry.get("samples")
            if not isinstance(listed, dict):
                raise DataError(f"{self.url}: shard '{entry['url']}' lists no member offsets ('samples'): the index "
                                f"was not written by anysr prepare shards; {FIX_INDEX}")
            rel = entry["url"]
            shards.append(rel if "://" in rel else posixpath.join(base, rel))
            filesize = entry.get("filesize", 0)
            if isinstance(filesize, bool) or not isinstance(filesize, int) or filesize < 0:
                raise DataError(f"{self.url}: shard '{rel}' has filesize {filesize!r}, not a byte count; {FIX_INDEX}")
            sizes.append(filesize)
            for key, members in listed.items():
                if key in samples:
                    raise DataError(f"{self.url}: sample '{key}' is in two shards; {FIX_INDEX}")
                try:
                    fields = {suffix.split(".", 1)[0]: (suffix, int(m[0]), int(m[1]), int(m[2]))
                              for suffix, m in members.items()}
                    headers = {suffix.split(".", 1)[0]: ImageInfo(int(m[3]), int(m[4]), int(m[5]), int(m[6]), str(m[7]))
                               for suffix, m in members.items() if len(m) >= 8}
                    start = min(m[1] for m in fields.values())  # (no member: ValueError)
                    end = max(m[1] + m[2] for m in fields.values())
                    if any(m[1] < 0 or m[2] < 0 for m in fields.values()) or any(
                            min(h.width, h.height, h.channels, h.bits) < 1 for h in headers.values()):
                        raise ValueError("negative offset or size, or an empty image")
                except (AttributeError, TypeError, ValueError, IndexError):
                    raise DataError(f"{self.url}: sample '{key}' in '{rel}' has malformed member entries (offsets, "
                                    f"sizes or image headers); {FIX_INDEX}") from None
                samples[key] = _Sample(n, start, end, fields, headers)
        if not samples:
            raise DataError(f"{self.url}: the shard index lists no samples")
        return shards, samples, sizes

    def shard_path(self, n: int) -> str:
        """Shard ``n`` as the file system names it."""
        return self.shards[n]

    def shard_url(self, n: int) -> str:
        """Shard ``n`` as a URL (for messages)."""
        path = self.shards[n]
        if "://" in path or not _scheme(self.url):
            return path
        return f"{_scheme(self.url)}://{path}"

    def read_span(self, sample: _Sample, key: str) -> bytes:
        """The bytes of ``sample``'s members from its shard (one ranged read)."""
        path = self.shard_path(sample.shard)
        try:
            data = self.fs.cat_file(path, start=sample.start, end=sample.end)
        except FileNotFoundError:
            raise DataError(f"{self.shard_url(sample.shard)}: shard not found (listed in {self.url}, sample "
                            f"'{key}'); copy the whole set again") from None
        except Exception as exc:  # the file system's own errors (botocore, aiohttp, google-auth ...)
            raise DataError(f"{self.shard_url(sample.shard)}: cannot read sample '{key}' ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); {_credentials_hint(self.url)}") from exc
        if len(data) != sample.end - sample.start:
            raise DataError(f"{self.shard_url(sample.shard)}: shard is shorter than its index says (sample '{key}' "
                            f"ends at byte {sample.end}, read {len(data)} of {sample.end - sample.start} bytes): it "
                            f"is truncated; copy it again or {FIX_INDEX}")
        return bytes(data)


# One ShardSet per (process, set, storage options): the GT and LQ backends of a paired set, and every dataset
# naming the same set, share one index and one file system handle. A per-process resource cache, not rank state.
_SETS: dict[str, ShardSet] = {}
_SETS_LOCK = threading.Lock()


def _reset_sets_lock() -> None:
    global _SETS_LOCK
    _SETS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_sets_lock)


def open_shard_set(root: str, storage_options: Mapping[str, Any] | None = None) -> ShardSet:
    """The shard set at ``root`` (a folder / URL prefix holding index.json, or the index's URL), read once."""
    key = json.dumps([index_url(root), dict(storage_options or {})], sort_keys=True, default=str)
    with _SETS_LOCK:
        found = _SETS.get(key)
        if found is None:
            found = _SETS[key] = ShardSet(root, storage_options)
        return found


class ShardCache:
    """Sample byte ranges kept on local disk, at most ``max_bytes`` in all, the least recently used dropped first.

    Several processes (loader workers, ranks of one host) may share ``folder``: writes and evictions happen under
    an exclusive lock on ``folder/.lock`` and the running total is kept in ``folder/.total`` (POSIX; elsewhere one
    process per folder). A hit is read without the lock; an entry evicted meanwhile is a miss.
    """

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"io_backend.cache_dir: cannot create {self.folder} ({exc}); choose a writable "
                            "folder") from None

    @staticmethod
    def name(*parts: object) -> str:
        """The entry name of a byte range (a hash of what identifies it)."""
        return hashlib.sha1("\0".join(map(str, parts)).encode("utf-8")).hexdigest() + ".bin"

    def get(self, name: str) -> bytes | None:
        path = self.folder / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        return data

    def discard(self, name: str) -> None:
        with self._locked():
            with contextlib.suppress(FileNotFoundError):
                size = (self.folder / name).stat().st_size
                (self.folder / name).unlink()
                self._write_total(self._read_total() - size)

    def put(self, name: str, data: bytes) -> None:
        """Keep ``data`` as entry ``name`` unless it alone is larger than the bound (older entries make room)."""
        if len(data) > self.max_bytes:
            return
        with self._locked():
            path = self.folder / name
            if path.exists():
                return
            total = self._read_total()
            if total + len(data) > self.max_bytes:
                total = self._evict(self.max_bytes - len(data))
            tmp = self.folder / f".{name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
            self._write_total(total + len(data))

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, size, path) of every entry."""
        out = []
        for e in os.scandir(self.folder):
            if e.name.endswith(".bin") and not e.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    out.append((st.st_mtime, st.st_size, Path(e.path)))
        return out

    def size(self) -> int:
        """The bytes the entries take now."""
        return sum(size for _, size, _ in self.entries())

    def _evict(self, target: int) -> int:
        entries = sorted(self.entries(), key=lambda e: (e[0], e[2].name))
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
        return total

    def _read_total(self) -> int:
        try:
            return int((self.folder / ".total").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return self.size()

    def _write_total(self, total: int) -> None:
        (self.folder / ".total").write_text(str(max(0, total)))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        with open(self.folder / ".lock", "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class ShardBackend(FileBackend):
    """One side (``field``: 'gt' or 'lq') of a shard set as a file backend: ``keys()`` are the sample keys that
    hold that side, ``get(key)`` the member's bytes, checked against the index's CRC-32.

    ``storage_options`` go to fsspec (``endpoint_url`` for an S3-compatible server, ``token`` for GCS ...);
    ``cache_dir`` with ``cache_bytes`` keeps what was read on local disk. The last samples read stay in memory (per
    set and process), so the GT and LQ of one pair are one read.
    """

    _RECENT = 8  # samples kept in memory (a pair's two sides, a few items of a batch)

    def __init__(self, root: str | os.PathLike[str], field: str = "gt", *,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 cache_bytes: int = 0) -> None:
        if field not in FIELDS:
            raise ValueError(f"field must be one of {FIELDS}, got {field!r}")
        self.root = os.fspath(root)
        self.field = field
        self.set = open_shard_set(self.root, storage_options)
        self._keys = sorted(k for k, s in self.set.samples.items() if field in s.members)
        if not self._keys:
            held = sorted({f for s in self.set.samples.values() for f in s.members})
            raise DataError(f"{self.set.url}: the shard set holds no '{field}' images (it holds "
                            f"{', '.join(held) or 'nothing'}); " + (
                                "prepare it with --lq LQ_FOLDER or set lq_from_gt: true" if field == "lq" else
                                FIX_INDEX))
        self.cache = ShardCache(cache_dir, cache_bytes) if cache_dir and cache_bytes > 0 else None

    def keys(self) -> list[str]:
        return list(self._keys)

    def describe(self, key_or_path: str) -> str:
        sample = self.set.samples.get(key_or_path)
        if sample is None or self.field not in sample.members:
            return f"{self.set.url} sample '{key_or_path}'"
        return f"{self.set.shard_url(sample.shard)} sample '{key_or_path}' ({sample.members[self.field][0]})"

    def header(self, key_or_path: str) -> ImageInfo | None:
        """The image header the index recorded (size, channels, pixel type): no read."""
        return self._sample(key_or_path).headers.get(self.field)

    def _sample(self, key: str) -> _Sample:
        sample = self.set.samples.get(key)
        if sample is None or self.field not in sample.members:
            raise DataError(f"{self.set.url}: no sample '{key}' with a '{self.field}' image"
                            f"{did_you_mean(key, self._keys)}")
        return sample

    def _span(self, key: str, sample: _Sample) -> tuple[bytes, bool]:
        """The sample's bytes and whether they came from the local cache."""
        with self.set.lock:
            found = self.set.recent.get(key)
            if found is not None:
                self.set.recent.move_to_end(key)
                return found, False
        name = ShardCache.name(self.set.url, self.set.shards[sample.shard], sample.start, sample.end)
        data = self.cache.get(name) if self.cache is not None else None
        cached = data is not None
        if data is None:
            data = self.set.read_span(sample, key)
            if self.cache is not None:
                self.cache.put(name, data)
        with self.set.lock:
            self.set.recent[key] = data
            while len(self.set.recent) > self._RECENT:
                self.set.recent.popitem(last=False)
        return data, cached

    def get(self, key_or_path: str) -> bytes:
        sample = self._sample(key_or_path)
        suffix, offset, size, crc = sample.members[self.field]
        for _ in range(2):
            data, cached = self._span(key_or_path, sample)
            member = data[offset - sample.start: offset - sample.start + size]
            if zlib.crc32(member) == crc:
                return member
            with self.set.lock:
                self.set.recent.pop(key_or_path, None)
            if not cached or self.cache is None:
                break
            self.cache.discard(ShardCache.name(self.set.url, self.set.shards[sample.shard], sample.start,
                                               sample.end))  # a damaged cache entry: read the shard again
        raise DataError(f"{self.set.shard_url(sample.shard)}: sample '{key_or_path}' member '{key_or_path}.{suffix}' "
                        f"does not match its checksum in {self.set.url}: the shard is corrupt or was rewritten after "
                        f"its index; copy it again or {FIX_INDEX}")


def shard_options(opt_io: Mapping[str, Any]) -> dict[str, Any]:
    """The ShardBackend keyword arguments of a validated ``io_backend`` section."""
    return {"storage_options": opt_io.get("storage_options") or None, "cache_dir": opt_io.get("cache_dir"),
            "cache_bytes": int(opt_io.get("cache_bytes") or DEFAULT_CACHE_BYTES)}


def _build(root: str, io_opt: Any, field: str) -> ShardBackend:
    return ShardBackend(root, field, **shard_options(io_opt or {}))


register_backend("shards", _build)
