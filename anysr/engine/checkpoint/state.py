"""Training states: one ``torch.save`` archive of everything that decides the future of a run, written
atomically with a whole-file sha256, loadable with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anysr.engine.checkpoint.common import STATE_FORMAT, STATE_KEY, PathLike, compact
from anysr.engine.checkpoint.integrity import (
    ALLOWED_STATE_TYPES,
    check_zip_stamp,
    describe_load_error,
    save_stamped,
    torch_load_bytes,
)
from anysr.errors import CheckpointError, OptionError
from anysr.tree import tree_map

STATE_RE = re.compile(r"^(\d+)\.state$")
_STATE_FIX = "delete it to resume from the previous state, or pass path.resume_state to pick a file"


def _host_tree(obj: Any, where: str) -> Any:
    """A copy of ``obj`` with tensors detached on the CPU; refuses what weights_only loading refuses."""
    def tensor(t: torch.Tensor, at: str) -> torch.Tensor:
        if t.layout != torch.strided:
            raise TypeError(f"{at} is a {t.layout} tensor; store it dense (.to_dense())")
        return compact(t.detach().cpu())

    def allowed(value: Any, at: str) -> Any:
        if type(value) not in ALLOWED_STATE_TYPES:
            hint = " (use torch.from_numpy)" if isinstance(value, np.ndarray | np.generic) else ""
            raise TypeError(f"{at} is a {type(value).__module__}.{type(value).__qualname__}{hint}")
        return value

    return tree_map(tensor, obj, leaf=allowed, container=allowed, path=where)


def save_training_state(path: PathLike, state: dict[str, Any]) -> Path:
    """Atomically write a training state that ``torch.load(path, weights_only=True)`` can read.

    Tensors are moved to the CPU; the saved dict gets ``'__anysr__': {'format': STATE_FORMAT}`` (the caller's dict
    is not modified) and the file a whole-file sha256 in its zip comment (the one integrity check).
    """
    path = Path(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot save training state {path}: expected a dict, "
                              f"got {type(state).__name__}")
    body = {k: v for k, v in state.items() if k != STATE_KEY}
    try:
        body = _host_tree(body, "state")
    except TypeError as exc:
        raise CheckpointError(
            f"cannot save training state {path}: {exc}, which torch.load(weights_only=True) cannot read "
            "back; store only tensors, numbers, strings, bytes, None, lists, tuples and dicts "
            "(e.g. obj.state_dict())"
        ) from None
    body[STATE_KEY] = {"format": STATE_FORMAT}
    return save_stamped(path, body)


class _Unusable(Exception):
    """Internal: a training state that cannot be used, with the reason."""


def _read_training_state(path: Path) -> dict[str, Any]:
    """Load and verify; raises _Unusable(reason)."""
    if not path.is_file():
        raise _Unusable("does not exist" if not path.exists() else "is not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unusable(f"cannot be read ({exc})") from exc
    stamp = check_zip_stamp(data)
    if stamp == "mismatch":
        raise _Unusable("checksum mismatch: the file changed after it was written "
                        "(a flipped byte or a bad copy)")
    if stamp == "damaged":
        raise _Unusable("truncated or corrupt: the end of the archive is missing or damaged "
                        "(an interrupted copy, a full disk?)")
    if stamp == "absent":
        raise _Unusable("it carries no anysr checksum: not written by anysr, or re-saved by another program "
                        "(load it there and save it with anysr, or start from its weights)")
    try:
        obj = torch_load_bytes(data)
    except Exception as exc:  # any failure of the unpickler means an unusable file
        raise _Unusable(describe_load_error(exc)) from exc
    if not isinstance(obj, dict) or not isinstance(obj.get(STATE_KEY), dict):
        raise _Unusable("not an anysr training state (no '__anysr__' record; "
                        "was it written by another tool?)")
    info = obj.pop(STATE_KEY)
    if info.get("format") != STATE_FORMAT:
        raise _Unusable(f"unknown anysr training state format {info.get('format')!r} (this anysr reads "
                        f"format {STATE_FORMAT}): written by another anysr version, or corrupt")
    return obj


def load_training_state(path: PathLike) -> dict[str, Any]:
    """Load a training state on the CPU with ``weights_only=True`` and verify it (without ``__anysr__``).

    Raises CheckpointError naming the file and what is wrong (truncated, checksum mismatch, refused by the
    safe unpickler, not an anysr training state) for any failure.
    """
    path = Path(path)
    try:
        return _read_training_state(path)
    except _Unusable as exc:
        raise CheckpointError(f"training state {path} is unusable: {exc}. Fix: {_STATE_FIX}") from None


def list_training_states(folder: PathLike) -> list[tuple[int, Path]]:
    """``(iteration, path)`` of the ``<iter>.state`` files in ``folder``, oldest first ([] if no folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        m = STATE_RE.match(entry.name)
        if m and entry.is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def _move_aside(path: Path) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt`` (or ``.corrupt.N``); None when it could not be moved."""
    target = path.with_name(path.name + ".corrupt")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt.{n}")
    try:
        os.replace(path, target)
    except FileNotFoundError:  # another rank moved it first
        return target
    except OSError:
        return None
    return target


def find_resume_state(folder: PathLike, *,
                      warn: Callable[[str], Any] = logging.warning) -> tuple[Path, dict[str, Any]] | None:
    """The newest training state in ``folder`` that loads and verifies, with its content; None if none.

    Each newer unusable one is reported through ``warn`` and moved aside to ``<name>.corrupt`` (never
    deleted), so the next run does not trip over it again.
    """
    for _, path in reversed(list_training_states(folder)):
        try:
            return path, _read_training_state(path)
        except _Unusable as exc:
            moved = _move_aside(path)
            where = (f"moved it aside to {moved.name}" if moved
                     else "could not move it aside (read-only folder?)")
            warn(f"skipping training state {path}: {exc}; {where} and trying the previous one")
    return None


def _verify_state_file(path: Path) -> bool:
    """Cheap check for pruning: the whole-file stamp (no unpickling)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return check_zip_stamp(data) == "ok"


def prune_training_states(folder: PathLike, keep_last: int | None) -> list[Path]:
    """Delete training states older than the newest ``keep_last`` valid ones; returns what was deleted.

    Unusable files among the newest are neither counted nor deleted. ``None`` keeps everything.
    """
    if keep_last is None:
        return []
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise OptionError(f"keep_last={keep_last!r}: keep at least 1 training state (or None to keep all)")
    states = list_training_states(folder)
    valid = 0
    cut = None
    for i in range(len(states) - 1, -1, -1):
        if _verify_state_file(states[i][1]):
            valid += 1
            if valid == keep_last:
                cut = i
                break
    if cut is None:
        return []
    removed = []
    for _, path in states[:cut]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed
