"""Files that are either old or new, never half-written: temp file, fsync, rename, folder fsync.

Every checkpoint, summary, options record and JSON file anysr writes goes through here; and the one rule for a
name that becomes part of a file name (``file_name_part_problem``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

PathLike = str | os.PathLike

logger = logging.getLogger("anysr")
_TEMP_RE = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


def _through_process_fd(path: Path) -> bool:
    """Whether ``path`` is, or links on to, a process's file descriptor (``/dev/stdout`` -> ``/proc/self/fd/1``,
    ``/dev/fd/N``): the open file behind it is written, whatever kind it is."""
    seen = 0
    current = str(path)
    while seen < 40:
        if re.match(r"^/(proc/[^/]+|dev)/fd/\d+$", current):
            return True
        if not os.path.islink(current):
            return False
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        seen += 1
    return False


def _write_through(path: Path, write_fn: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` in place (a device, a pipe, a socket, a process's descriptor): appended, never truncated,
    created or renamed over."""
    try:
        with open(path, "ab") as f:
            write_fn(f)
            f.flush()
            with contextlib.suppress(OSError):  # pipes and terminals cannot be fsynced
                os.fsync(f.fileno())
    except OSError as e:
        raise type(e)(e.errno, e.strerror, str(path)) from None
    return path


def write_target(path: PathLike) -> tuple[Path, str]:
    """Where ``atomic_write(path)`` writes and how: ``(path, "replace")`` for a regular file or a new name;
    ``(its target, "follow")`` for a symbolic link to one (the file it names is replaced, the link kept);
    ``(path, "through")`` for a device, a pipe, a socket or a process's descriptor (``/dev/stdout``): written in
    place, never replaced by a regular file."""
    path = Path(path)
    if _through_process_fd(path):
        return path, "through"
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return path, "through"
    if path.is_symlink():
        return Path(os.path.realpath(path)), "follow"
    return path, "replace"


def atomic_write(path: PathLike, write_fn: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` so that readers only ever see the old file or the complete new one; returns the file
    written.

    ``write_fn`` fills a temp file ``.<name>.tmp-<pid>-<random>`` in the same folder; it is flushed,
    fsynced and renamed over ``path`` (the folder is fsynced too). On any exception the temp file is
    removed and the exception propagates; the old ``path`` is untouched. What ``path`` is decides the rest
    (``write_target``): a symbolic link is followed (its target is replaced, the link kept, and logged), a
    device, pipe or ``/dev/stdout`` is written through in place.
    """
    given = path
    path, how = write_target(given)
    if how == "through":
        return _write_through(path, write_fn)
    if how == "follow":
        logger.info("%s is a symbolic link: writing the file it names, %s (the link is kept)", given, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    published = False
    try:
        with open(tmp, "xb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        published = True
    except OSError as e:
        if e.filename != str(tmp):
            raise
        # The temp file's name means nothing to the user: the error names the file being written (a read-only
        # folder, a full disk), with the same errno for the callers that tell them apart.
        raise type(e)(e.errno, e.strerror, str(path)) from None
    finally:
        if not published:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    _fsync_folder(path.parent)
    return path


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """``atomic_write`` of a bytes object."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: PathLike, data: Any) -> Path:
    """``atomic_write`` of ``data`` as indented JSON (every JSON file anysr writes goes through here)."""
    return atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; folders cannot be opened on Windows and some file systems refuse it."""
    if os.name == "nt":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there; be conservative
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def clean_stale_temps(folder: PathLike) -> list[Path]:
    """Remove temp files left by a save that was killed; returns what was removed.

    Only names made by ``atomic_write`` are touched, and only those whose writing process is no
    longer alive on this machine (a temp file is never mistaken for a checkpoint: only the rename
    publishes one).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in sorted(folder.iterdir()):
        m = _TEMP_RE.match(entry.name)
        if not m or not entry.is_file() or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


MAX_NAME_BYTES = 200  # folder names may have 255 bytes; log files add the date to the name


def file_name_part_problem(value: str) -> str | None:
    """Why ``value`` cannot be (part of) one file or folder name, or None: a separator, NUL, '.' or '..' would
    write elsewhere, an empty or too long name fails later. The rule for ``name``, ``val.suffix`` and ``--suffix``."""
    if not value.strip() or value in (".", "..") or any(c in value for c in ("/", "\\", "\0")):
        return "a part of a file name: without '/', '\\' or NUL, not empty, '.' or '..'"
    if len(value.encode("utf-8")) > MAX_NAME_BYTES:
        return f"a part of a file name, at most {MAX_NAME_BYTES} bytes"
    return None
