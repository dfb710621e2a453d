"""Where image bytes come from: a folder on disk, a BasicSR-style LMDB or a shard set (``anysr.data.shards``),
behind one interface.

Both backends answer ``get(key_or_path) -> bytes`` and ``keys() -> list[str]``; ``decode_training_image`` turns
the bytes into a BasicSR numpy image (HWC BGR, or HW for single-channel files) at the file's own depth: uint8 for
8-bit files, uint16 for 16-bit ones. ``decode_uint8`` is the same scaled to 8 bits (video frames).
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from anysr.data import imageio
from anysr.errors import DataError, did_you_mean

BACKEND_TYPES = ("disk", "lmdb", "shards")


def is_image_file(name: str | os.PathLike[str]) -> bool:
    """True for a non-hidden file name with one of ``imageio.IMAGE_EXTENSIONS`` (case-insensitive)."""
    return not os.path.basename(os.fspath(name)).startswith(".") and imageio.is_image_file(name)


def _unsupported(name: str, dtype: str) -> DataError:
    return DataError(f"{name}: unsupported pixel type {dtype}; training reads 8- or 16-bit images: convert it to "
                     "an 8- or 16-bit PNG")


def check_pixel_type(info: imageio.ImageInfo, name: str) -> imageio.ImageInfo:
    """``info`` when its pixels are what training decodes (8- or 16-bit integers); else a DataError naming
    ``name`` (a float or 32-bit TIFF, found by the start-up check instead of at the iteration that reads it)."""
    if info.dtype not in ("uint8", "uint16"):
        raise _unsupported(name, info.dtype)
    return info


def decode_training_image(buf: bytes, name: str, flag: str = "unchanged") -> np.ndarray:
    """Decode encoded image bytes (``imageio.decode_image``) into a BasicSR training image at its own depth.

    Returns HWC BGR, or HW for a single-channel file (``flag='unchanged'``), as uint8 for 8-bit files and uint16
    for 16-bit ones (the low byte kept: ``img2tensor`` maps both to [0, 1]); an alpha channel is dropped. Float or
    32-bit pixels, and a corrupt image, are a DataError naming ``name``.
    """
    img = imageio.decode_image(buf, flag=flag, source=name)
    if img.dtype not in (np.uint8, np.uint16):
        raise _unsupported(name, img.dtype.name)
    if img.ndim == 3:
        if img.shape[2] == 1:
            img = img[:, :, 0]
        elif img.shape[2] == 4:
            img = np.ascontiguousarray(img[:, :, :3])
    return img


def to_uint8(img: np.ndarray) -> np.ndarray:
    """A uint16 image scaled to 8 bits (``round(x / 257)``); a uint8 image as it is."""
    if img.dtype == np.uint16:
        return np.clip(np.rint(img.astype(np.float32) / 257.0), 0, 255).astype(np.uint8)
    return img


def decode_uint8(buf: bytes, name: str, flag: str = "unchanged") -> np.ndarray:
    """``decode_training_image`` scaled to 8 bits: uint8 HWC BGR, or uint8 HW for a single-channel file."""
    return to_uint8(decode_training_image(buf, name, flag))


class FileBackend(ABC):
    """A source of encoded image bytes addressed by key (LMDB) or by file name / path (disk)."""

    root: str

    @abstractmethod
    def get(self, key_or_path: str) -> bytes:
        """The encoded bytes of one image; a DataError naming it when it is missing."""

    @abstractmethod
    def keys(self) -> list[str]:
        """The images this backend holds (file names relative to the root, or LMDB keys), sorted."""

    def describe(self, key_or_path: str) -> str:
        """A human-readable location of one image, for error messages."""
        return key_or_path

    def header(self, key_or_path: str) -> imageio.ImageInfo | None:
        """The image's header when the backend knows it without reading the image (a shard index), else None."""
        return None

    def read(self, key_or_path: str, flag: str = "unchanged") -> np.ndarray:
        """``get`` then ``decode_training_image``: uint8 or uint16, the file's own depth."""
        return decode_training_image(self.get(key_or_path), self.describe(key_or_path), flag)

    def read_uint8(self, key_or_path: str, flag: str = "unchanged") -> np.ndarray:
        """``get`` then ``decode_uint8`` (16-bit files scaled to 8 bits)."""
        return decode_uint8(self.get(key_or_path), self.describe(key_or_path), flag)


class DiskBackend(FileBackend):
    """Image files in a folder. ``get`` takes a path relative to ``root`` or an existing absolute path."""

    def __init__(self, root: str | os.PathLike[str] = "") -> None:
        self.root = os.fspath(root)

    def path_of(self, key_or_path: str) -> str:
        if os.path.isabs(key_or_path) or not self.root:
            return key_or_path
        return os.path.join(self.root, key_or_path)

    def describe(self, key_or_path: str) -> str:
        return self.path_of(key_or_path)

    def get(self, key_or_path: str) -> bytes:
        path = self.path_of(key_or_path)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise DataError(f"{path}: image file not found; check the dataroot / meta_info file.") from None
        except OSError as exc:
            raise DataError(f"{path}: cannot read the image file ({exc}).") from exc

    def keys(self) -> list[str]:
        if not os.path.isdir(self.root):
            raise DataError(f"{self.root}: image folder not found.")
        return sorted(e.name for e in os.scandir(self.root) if e.is_file() and is_image_file(e.name))


def _import_lmdb() -> Any:
    try:
        import lmdb  # noqa: PLC0415 - optional dependency (anysr[lmdb])
    except ImportError:
        raise DataError(
            "io_backend type 'lmdb' needs the lmdb package: pip install anysr[lmdb] (or pip install lmdb)"
        ) from None
    return lmdb


def read_lmdb_meta_info(db_path: str | os.PathLike[str]) -> list[str]:
    """Keys listed in ``<db>/meta_info.txt`` (lines ``<key>.png (h,w,c) <compress>``; the key is the stem)."""
    meta = Path(db_path) / "meta_info.txt"
    if not meta.is_file():
        raise DataError(
            f"{meta}: LMDB meta_info.txt not found; an LMDB dataset is a folder '<name>.lmdb' holding "
            "data.mdb and meta_info.txt (create it with anysr prepare lmdb or BasicSR's "
            "scripts/data_preparation/create_lmdb.py)."
        )
    try:
        text = meta.read_text(encoding="utf-8-sig")  # a BOM (Notepad) is not part of the first key
    except UnicodeDecodeError as exc:
        raise DataError(f"{meta}: not UTF-8 text (byte {exc.start}); rebuild the LMDB (anysr prepare lmdb) or "
                        "re-create its meta_info.txt") from None
    keys = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name = line.split()[0]
        keys.append(os.path.splitext(name)[0] if is_image_file(name) else name)
    return keys


# One read-only environment per (process, LMDB folder): py-lmdb refuses to open the same files twice in a
# process, and a handle inherited through fork must not be used, so a forked child closes its copy and opens
# its own. This is a per-process resource cache (shared by threads), not rank state.
_ENVS: dict[str, tuple[int, Any]] = {}
_ENVS_LOCK = threading.Lock()


def _reset_env_lock() -> None:
    global _ENVS_LOCK
    _ENVS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_env_lock)


def _process_env(root: str) -> Any:
    """This process's read-only environment for the LMDB folder ``root`` (opened on first use)."""
    key = os.path.realpath(root)
    pid = os.getpid()
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[0] == pid:
            return entry[1]
        lmdb = _import_lmdb()
        if entry is not None:  # inherited from the parent through fork: release our copy of it
            with contextlib.suppress(lmdb.Error):
                entry[1].close()
        env = _open_checked(lmdb, root)
        _ENVS[key] = (pid, env)
        return env


def _open_checked(lmdb: Any, root: str) -> Any:
    """Open ``root`` read-only, refusing a damaged ``data.mdb`` before a read touches it: LMDB maps the file and
    trusts its header, so a page past the end of a truncated file kills the process with SIGBUS."""
    fix = "rebuild the LMDB (anysr prepare lmdb) or copy it again"
    try:
        env = lmdb.open(root, readonly=True, lock=False, readahead=False, meminit=False, subdir=True)
    except lmdb.Error as exc:
        raise DataError(f"{root}: not a readable LMDB ({exc}); {fix}") from None
    try:
        need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
        size = os.path.getsize(os.path.join(root, "data.mdb"))
    except lmdb.Error as exc:
        env.close()
        raise DataError(f"{root}: not a readable LMDB ({exc}); {fix}") from None
    if size < need:
        env.close()
        raise DataError(f"{root}/data.mdb is truncated or damaged ({size} bytes where its header says {need}); "
                        f"{fix}")
    return env


def _close_process_env(root: str) -> None:
    key = os.path.realpath(root)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[0] == os.getpid():
            del _ENVS[key]
            entry[1].close()


class LmdbBackend(FileBackend):
    """A BasicSR LMDB folder (``x.lmdb`` with data.mdb and meta_info.txt), keys are image stems.

    The environment is opened lazily (readonly, lock=False) by the process that first reads and shared by
    every backend of that folder in the process; a DataLoader worker (fork or spawn) opens its own.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        _import_lmdb()
        if not os.path.isdir(self.root) or not os.path.isfile(os.path.join(self.root, "data.mdb")):
            raise DataError(
                f"{self.root}: not an LMDB dataset (expected a folder with data.mdb and meta_info.txt); "
                "check the dataroot or set io_backend.type: disk."
            )
        self._keys = read_lmdb_meta_info(self.root)

    def close(self) -> None:
        """Close this process's environment of the folder (it reopens on the next read)."""
        _close_process_env(self.root)

    def describe(self, key_or_path: str) -> str:
        return f"{self.root} key '{key_or_path}'"

    def get(self, key_or_path: str) -> bytes:
        lmdb = _import_lmdb()
        try:
            with _process_env(self.root).begin(write=False) as txn:
                buf = txn.get(key_or_path.encode("utf-8"))
        except lmdb.Error as exc:
            raise DataError(f"{self.describe(key_or_path)}: the LMDB is damaged ({exc}); rebuild it (anysr prepare "
                            "lmdb) or copy it again") from None
        if buf is None:
            raise DataError(
                f"{self.describe(key_or_path)}: key not in the LMDB"
                f"{did_you_mean(key_or_path, [k for k in self._keys if k != key_or_path])}; "
                "meta_info.txt and data.mdb disagree, rebuild the LMDB."
            )
        return bytes(buf)

    def keys(self) -> list[str]:
        return sorted(self._keys)


# Backends defined in modules of their own (``anysr.data.shards``), registered there: kind -> builder(root, io_opt,
# field). ``anysr.data`` imports those modules, so every kind in BACKEND_TYPES is here once the package is loaded.
_BUILDERS: dict[str, Callable[[str, Any, str], FileBackend]] = {}


def register_backend(kind: str, builder: Callable[[str, Any, str], FileBackend]) -> None:
    """Make ``build_backend(kind, root, io_opt, field)`` call ``builder(root, io_opt, field)``."""
    _BUILDERS[kind] = builder


def build_backend(kind: str, root: str | os.PathLike[str], io_opt: Any = None, field: str = "gt") -> FileBackend:
    """A backend for ``root``: ``kind`` is the validated ``io_backend.type`` (one of ``BACKEND_TYPES``); a shard set
    reads its ``field`` side ('gt' or 'lq') with the section ``io_opt``'s storage options and cache."""
    if kind in _BUILDERS:
        return _BUILDERS[kind](os.fspath(root), io_opt, field)
    return LmdbBackend(root) if kind == "lmdb" else DiskBackend(root)
