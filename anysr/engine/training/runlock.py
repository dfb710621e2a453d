"""One run per experiment folder: an exclusive lock held for the life of the run.

The lock is an OS file lock (``fcntl.flock`` on ``<folder>/.anysr.lock``), so it is released by the kernel when
the holder exits in any way, ``kill -9`` included: a lock file left behind by a dead run is stale by construction
and simply taken over. The file records who holds it (pid, host, start time, command) for the refusal message.
File systems without working locks (some network mounts) fall back to the recorded pid: alive on this host means
held.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from anysr.errors import OptionError

LOCK_NAME = ".anysr.lock"

try:
    import fcntl
except ImportError:  # Windows: the recorded pid is all there is
    fcntl = None  # type: ignore[assignment]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    started = holder["started"] if "started" in holder else None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    pid, host = (holder[k] if k in holder else "?" for k in ("pid", "host"))
    return f"pid {pid} on {host}, started {when}"


class RunLock:
    """``with RunLock(folder, what='training'):`` - refuses (OptionError) while another run holds ``folder``."""

    def __init__(self, folder: str | os.PathLike[str], *, what: str = "run") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self._fd: int | None = None

    def _holder(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
            return data if isinstance(data, dict) else {}
        return {}

    def _refuse(self, holder: dict[str, Any]) -> OptionError:
        return OptionError(f"{self.folder} is in use by another anysr {self.what} ({_describe(holder)}); wait for "
                           "it to finish, stop it, or choose another `name`")

    def acquire(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        held = False
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise self._refuse(self._holder()) from None
                except OSError:  # no locks on this file system: trust the recorded pid on this host
                    self._check_recorded()
            else:
                self._check_recorded()
            record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                      "command": " ".join(sys.argv[:4])}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            held = True
        finally:
            if not held:
                os.close(fd)
        self._fd = fd
        return self

    def _check_recorded(self) -> None:
        holder = self._holder()
        pid, host = (holder[k] if k in holder else None for k in ("pid", "host"))
        if isinstance(pid, int) and pid != os.getpid() and host == socket.gethostname() \
                and _pid_alive(pid):
            raise self._refuse(holder)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
