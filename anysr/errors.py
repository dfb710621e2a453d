"""Errors that are part of the interface: each names the culprit and the fix."""

from __future__ import annotations

import difflib
import errno
import os
from collections.abc import Iterable
from typing import Any, TypeVar


class AnysrError(Exception):
    """Base class of every error anysr raises on purpose (the CLI prints these without a traceback).

    ``all_ranks``: every rank of a distributed run raises this same error (it follows a collective), so only
    rank 0 needs to say it (see ``everywhere``).
    """

    all_ranks = False

    def __str__(self) -> str:
        # Raised in a DataLoader worker, torch re-raises it in the main process as ``type(exc)(text)`` with the
        # worker's whole traceback in the text; what the user needs is the original message at its end.
        text = super().__str__()
        if text.startswith("Caught ") and "Original Traceback" in text:
            head = f"{type(self).__module__}.{type(self).__qualname__}: "
            at = text.rfind("\n" + head)
            if at >= 0:
                return text[at + 1 + len(head):].strip()
        return text


E = TypeVar("E", bound=BaseException)


def everywhere(exc: E) -> E:
    """Mark ``exc`` as raised alike on every rank (decided after a collective); returns it."""
    exc.all_ranks = True
    return exc


class AlreadyReported(AnysrError):
    """The failure was already told (by a worker); exit with ``exit_code`` without another message."""

    def __init__(self, exit_code: int) -> None:
        super().__init__("")
        self.exit_code = exit_code


# Exit status of a worker that stopped because a collective failed: another rank failed first and says why.
PEER_FAILED = 3

_ERRNO_HINTS = {
    errno.ENOSPC: "the disk is full; free space, then {then}",
    errno.EDQUOT: "the disk quota is exceeded; free space, then {then}",
    errno.EROFS: "the file system is read-only; choose a writable folder (path.root / -o)",
    errno.EACCES: "permission denied; choose a folder you can write to, or fix its permissions",
    errno.EPERM: "operation not permitted; choose a folder you can write to",
    errno.ENAMETOOLONG: "the file name is too long for the file system; use a shorter `name` or path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; fix the path",
    errno.EISDIR: "a folder is where a file was expected; fix the path",
    errno.ENOENT: "no such file or folder; check the path",
    errno.EMFILE: "too many open files; raise `ulimit -n` or lower num_worker_per_gpu",
}


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def describe_os_error(exc: OSError, *, then: str = "run the command again") -> str:
    """One line for an operating-system error a user or the machine can cause (disk full, read-only, ...);
    ``then``: what to do once space is freed (a full disk or quota)."""
    if exc.errno == errno.EEXIST and exc.filename and os.path.isfile(exc.filename):  # mkdir where a file is
        return f"{exc.filename} is a file where a folder is needed; fix the path (or move the file)"
    what = exc.strerror or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename else ""
    hint = _ERRNO_HINTS.get(exc.errno or -1)
    return f"{what}{where}" + (f": {hint.format(then=then)}" if hint else "")


class OptionError(AnysrError):
    """A bad option: unknown key, wrong type, missing key or path."""


class ArchArgumentError(OptionError):
    """A constructor argument of an architecture has a value it cannot build with.

    ``arg`` is the argument's name, so ``build_network`` can report the full option key path
    (``network_g.<arg>``).
    """

    def __init__(self, arg: str, message: str) -> None:
        super().__init__(f"{arg}: {message}")
        self.arg = arg
        self.detail = message


class DataError(AnysrError):
    """A missing, unreadable or corrupt image or dataset."""


class CheckpointError(AnysrError):
    """A missing, truncated, corrupt or incompatible checkpoint."""


class AcceleratorError(AnysrError):
    """An accelerator that is not available or a device count that cannot be honoured."""


class TrainingError(AnysrError):
    """Training cannot go on (for example a NaN loss)."""


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``name`` (for 'did you mean' hints), or None."""
    found = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' when nothing is close."""
    hit = nearest(name, candidates)
    return f" (did you mean '{hit}'?)" if hit else ""


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (then '...'), for one-line messages quoting a user's value."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
