"""Verified, resumable HTTP downloads: the one downloader behind standard weight files and ``anysr prepare fetch``.

``download(url, dest, ...)`` writes into ``<dest>.part``, asks the server to continue a ``.part`` left by an earlier
run (HTTP ``Range``; a server that answers with the whole file starts it again), checks the size and the published
checksum (sha256 or md5; a sha256 prefix is checked as torch.hub checks its file names), then renames the file into
place (fsynced), so ``dest`` is whole and verified or absent. A file that does not match is kept aside as
``<dest>.bad`` (or deleted) and never used. Failures raise ``DownloadFailed`` with a short reason; each caller words
the one-line error (its own error class, option name and fix). Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from anysr.atomic import _fsync_folder

__all__ = ["OFFLINE_VARS", "Digests", "DownloadFailed", "download", "file_digests", "file_lock", "offline_reason",
           "part_path"]

OFFLINE_VARS = ("ANYSR_OFFLINE", "HF_HUB_OFFLINE")  # either set to 1 / true / yes: no download
TIMEOUT_S = 60.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Digests:
    """A downloaded file's size and checksums (hex)."""

    size: int
    sha256: str
    md5: str


class DownloadFailed(Exception):
    """A download that did not give the expected file. ``kind``: ``http`` (the server answered an error status,
    ``status`` set), ``network`` (no connection, a timeout, a cut connection), ``size`` or ``checksum`` (the bytes
    are not the pinned file; ``digests`` set, the file kept at ``kept`` or deleted)."""

    def __init__(self, kind: str, reason: str, *, status: int | None = None, digests: Digests | None = None,
                 kept: Path | None = None) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.status, self.digests, self.kept = kind, reason, status, digests, kept


def offline_reason() -> str | None:
    """The variable that forbids downloading (``ANYSR_OFFLINE=1``), or None."""
    for var in OFFLINE_VARS:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    return None


def part_path(dest: Path) -> Path:
    """Where the download of ``dest`` grows until it is verified."""
    return dest.with_name(dest.name + ".part")


def file_digests(path: Path) -> Digests:
    """Size, sha256 and md5 of a file, read once."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return Digests(size, sha.hexdigest(), md5.hexdigest())


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (and threads: each opens its own descriptor) on ``path``; none where
    the platform has no ``fcntl`` (the atomic rename still keeps files whole)."""
    try:
        import fcntl  # noqa: PLC0415 - POSIX only
    except ImportError:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a+b")  # noqa: SIM115 - closed below, after the unlink
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                    break  # the lock file is still the one at ``path``: ours
        except OSError:
            handle.close()
            raise
        handle.close()  # the holder before us removed it: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # no lock file left behind; a waiter sees the inode change and locks anew
        handle.close()


def _progress(total: int | None, initial: int, desc: str, enabled: bool):  # noqa: ANN202 - a tqdm bar or None
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional here (a core dependency of anysr)
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=None,
                leave=False)


def _open(url: str, offset: int, timeout: float) -> http.client.HTTPResponse:
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) URLs of anysr's tables


def _continues_at(response: http.client.HTTPResponse, offset: int) -> bool:
    """Whether a ``206`` answer starts at ``offset`` (``Content-Range: bytes OFFSET-END/TOTAL``)."""
    value = response.headers.get("Content-Range", "")
    try:
        return response.status == 206 and int(value.split()[1].split("-")[0]) == offset
    except (IndexError, ValueError):
        return False


def _receive(url: str, part: Path, *, resume: bool, desc: str, progress: bool, timeout: float) -> None:
    """Fill ``part`` with the whole file at ``url``, continuing what it holds when ``resume``."""
    offset = part.stat().st_size if resume and part.is_file() else 0
    try:
        response = _open(url, offset, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # nothing after the offset: the part may already be whole (checked next)
            return
        raise
    with response:
        if offset and not _continues_at(response, offset):
            offset = 0  # the server sent the whole file: start again
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        total = offset + expected if expected is not None else None
        bar = _progress(total, offset, desc, progress)
        got = 0
        try:
            with open(part, "ab" if offset else "wb") as out:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    got += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
        finally:
            if bar is not None:
                bar.close()
        if expected is not None and got != expected:
            raise ConnectionError(f"the connection ended after {offset + got} of {total} bytes")


def download(url: str, dest: Path, *, size: int | None = None, sha256: str | None = None, md5: str | None = None,
             resume: bool = True, keep_bad: bool = True, desc: str | None = None, progress: bool = True,
             timeout: float = TIMEOUT_S) -> Digests:
    """Download ``url`` to ``dest``, verified against ``size`` / ``sha256`` (64 hex digits, or a prefix) / ``md5``
    (any of them None: not checked); returns the file's digests.

    ``resume``: a ``<dest>.part`` left by an interrupted run is continued (HTTP Range) and kept when this run fails
    too; otherwise it is removed on failure. A file that fails the check is renamed ``<dest>.bad`` (``keep_bad``)
    or deleted. Raises ``DownloadFailed`` (HTTP status, network, size, checksum); OSError for the local disk
    (a full disk keeps the ``.part`` when ``resume``, so a rerun continues)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    if not resume:
        part.unlink(missing_ok=True)
    ok = False
    try:
        try:
            _receive(url, part, resume=resume, desc=desc or dest.name, progress=progress, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise DownloadFailed("http", f"HTTP {exc.code}", status=exc.code) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, ValueError) as exc:
            why = getattr(exc, "reason", None) or type(exc).__name__ + (f": {exc}" if str(exc) else "")
            raise DownloadFailed("network", str(why)) from None
        digests = file_digests(part)
        problem = None
        if size is not None and digests.size != size:
            problem = ("size", f"{digests.size} bytes, expected {size}")
        elif sha256 is not None and not digests.sha256.startswith(sha256.lower()):
            shown = sha256 if len(sha256) == 64 else f"{sha256}... (prefix)"
            problem = ("checksum", f"sha256 {digests.sha256}, expected {shown}")
        elif md5 is not None and digests.md5 != md5.lower():
            problem = ("checksum", f"md5 {digests.md5}, expected {md5}")
        if problem is not None:
            kept = None
            if keep_bad:
                kept = dest.with_name(dest.name + ".bad")
                os.replace(part, kept)
            else:
                part.unlink()
            raise DownloadFailed(problem[0], problem[1], digests=digests, kept=kept)
        os.replace(part, dest)
        _fsync_folder(dest.parent)
        ok = True
        return digests
    finally:
        if not ok and not resume:
            part.unlink(missing_ok=True)
