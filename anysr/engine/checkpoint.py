"""Checkpoints that cannot corrupt: atomic writes, verified training states, safe weight loading.

* Every file is published by one ``os.replace`` of a fsynced temp file in the same folder, so a
  ``kill -9`` during a save leaves either the old file or the new one, never half of one.
* A training state is a plain ``torch.save`` archive (it loads with ``torch.load(weights_only=True)``)
  that carries a digest of its content (``state['__anysr__']``) and a sha256 of the whole file in the
  zip comment, so a flipped byte anywhere or a truncated copy is refused instead of resumed from.
* Weights are safetensors (``<group>.<param>`` names, JSON metadata from which the net can be rebuilt)
  or BasicSR ``.pth`` files read through ``torch.load(weights_only=True)``; both are memory-mapped (except
  pre-1.6 .pth files), so ranks reading one file share the page cache instead of holding a copy each.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import mmap
import os
import pickle
import re
import secrets
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save
from torch import nn

from anysr.errors import CheckpointError, OptionError
from anysr.tree import tree_map

__all__ = [
    "atomic_write",
    "atomic_write_bytes",
    "clean_stale_temps",
    "tree_digest",
    "save_training_state",
    "load_training_state",
    "list_training_states",
    "find_resume_state",
    "prune_training_states",
    "save_weights",
    "save_weights_pth",
    "load_weights",
    "read_weights_metadata",
    "load_into",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
STATE_FORMAT = 1
WEIGHTS_FORMAT = 1
_STATE_KEY = "__anysr__"
_STATE_RE = re.compile(r"^(\d+)\.state$")
_TEMP_RE = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")
_STATE_FIX = "delete it to resume from the previous state, or pass path.resume_state to pick a file"
_WEIGHTS_FIX = ("Fix: re-download or re-export it, or point the option naming it "
                "(e.g. path.pretrain_network_g) at another file")
_RESERVED_META = ("anysr_format", "groups", "digest")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


# --------------------------------------------------------------------------------------------- atomic files
def atomic_write(path: PathLike, write_fn: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` so that readers only ever see the old file or the complete new one.

    ``write_fn`` fills a temp file ``.<name>.tmp-<pid>-<random>`` in the same folder; it is flushed,
    fsynced and renamed over ``path`` (the folder is fsynced too). On any exception the temp file is
    removed and the exception propagates; the old ``path`` is untouched.
    """
    path = Path(path)
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
    finally:
        if not published:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    _fsync_folder(path.parent)
    return path


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """``atomic_write`` of a bytes object."""
    return atomic_write(path, lambda f: f.write(data))


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


# --------------------------------------------------------------------------------------------- digests
_ALLOWED_STATE_TYPES = (dict, OrderedDict, list, tuple, torch.Size, set, str, int, float, complex, bool,
                        bytes, type(None), torch.dtype, torch.device)


def _tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU uint8 view of a tensor's values (works for bf16, bool, complex, 0-d)."""
    t = t.detach()
    if t.layout != torch.strided:
        raise TypeError(f"cannot digest a {t.layout} tensor; convert it with .to_dense()")
    t = t.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return t.view(torch.uint8)


def _len_prefixed(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<Q", len(payload)) + payload


def _walk(h: Any, obj: Any, where: str) -> None:
    """Feed a canonical, type-tagged encoding of ``obj`` into the hash ``h``."""
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"B1" if obj else b"B0")
    elif isinstance(obj, int):
        h.update(_len_prefixed(b"I", str(int(obj)).encode()))
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, complex):
        h.update(b"C" + struct.pack("<dd", obj.real, obj.imag))
    elif isinstance(obj, str):
        h.update(_len_prefixed(b"S", obj.encode("utf-8", "surrogatepass")))
    elif isinstance(obj, bytes | bytearray):
        h.update(_len_prefixed(b"Y", bytes(obj)))
    elif isinstance(obj, torch.Tensor):
        raw = _tensor_bytes(obj)
        h.update(_len_prefixed(b"X", f"{obj.dtype}|{tuple(obj.shape)}".encode()))
        h.update(struct.pack("<Q", raw.numel()))
        h.update(memoryview(raw.numpy()))
    elif isinstance(obj, np.ndarray | np.generic):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"{where}: cannot digest a numpy array of Python objects")
        h.update(_len_prefixed(b"A", f"{arr.dtype.str}|{arr.shape}".encode()))
        h.update(struct.pack("<Q", arr.nbytes))
        h.update(memoryview(arr.reshape(-1).view(np.uint8)))
    elif isinstance(obj, torch.dtype):
        h.update(_len_prefixed(b"d", str(obj).encode()))
    elif isinstance(obj, torch.device):
        h.update(_len_prefixed(b"v", str(obj).encode()))
    elif isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            kh = hashlib.sha256()
            _walk(kh, k, f"{where} key {k!r}")
            items.append((kh.digest(), k, v))
        items.sort(key=lambda item: item[0])
        h.update(b"D" + struct.pack("<Q", len(items)))
        for kd, k, v in items:
            h.update(kd)
            _walk(h, v, f"{where}[{k!r}]")
    elif isinstance(obj, list | tuple):
        h.update((b"L" if isinstance(obj, list) else b"T") + struct.pack("<Q", len(obj)))
        for i, v in enumerate(obj):
            _walk(h, v, f"{where}[{i}]")
    elif isinstance(obj, set | frozenset):
        parts = []
        for v in obj:
            vh = hashlib.sha256()
            _walk(vh, v, f"{where} element {v!r}")
            parts.append(vh.digest())
        h.update(b"E" + struct.pack("<Q", len(parts)) + b"".join(sorted(parts)))
    else:
        raise TypeError(f"{where}: cannot digest a {type(obj).__module__}.{type(obj).__qualname__}")


def tree_digest(obj: Any) -> str:
    """sha256 (hex) of a canonical walk of nested dicts (sorted keys), lists, tuples, sets, tensors
    (dtype, shape, raw bytes), numpy arrays and primitives; the same content always gives the same digest,
    whatever the dict order, device, strides or memory layout."""
    h = hashlib.sha256()
    _walk(h, obj, "obj")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- zip stamp
# A torch.save archive is a zip file; its end record may carry a comment that torch ignores. We put a
# sha256 of everything before the comment there, so a flipped byte anywhere in the file is detected.
_EOCD_SIG = b"PK\x05\x06"
_EOCD_LEN = 22
_STAMP_MAGIC = b"anysr-sha256:"
_STAMP_LEN = len(_STAMP_MAGIC) + 64


def _stamped_chunks(data: memoryview) -> list[Any]:
    """The pieces of ``data`` with a whole-file sha256 in its zip comment, without copying ``data``
    (``[data]`` unchanged if it is not a comment-less zip)."""
    if len(data) < _EOCD_LEN or data[-_EOCD_LEN:-_EOCD_LEN + 4] != _EOCD_SIG or data[-2:] != b"\0\0":
        return [data]
    comment_len = struct.pack("<H", _STAMP_LEN)
    h = hashlib.sha256(data[:-2])
    h.update(comment_len)
    return [data[:-2], comment_len, _STAMP_MAGIC + h.hexdigest().encode()]


def _save_stamped(path: Path, obj: Any) -> Path:
    """``torch.save(obj)`` into memory, stamp it and write it atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with buf.getbuffer() as view:
        chunks = _stamped_chunks(view)

        def write(f: BinaryIO) -> None:
            for chunk in chunks:
                f.write(chunk)

        atomic_write(path, write)
        chunks.clear()
    return path


def _check_zip_stamp(data: bytes) -> str:
    """'ok', 'absent' (a plain zip end record), 'mismatch' or 'damaged' (no recognisable end record)."""
    end = len(data) - _STAMP_LEN
    if end >= _EOCD_LEN and data[end - _EOCD_LEN:end - _EOCD_LEN + 4] == _EOCD_SIG \
            and data[end:end + len(_STAMP_MAGIC)] == _STAMP_MAGIC:
        if data[end - 2:end] != struct.pack("<H", _STAMP_LEN):
            return "damaged"
        ok = hashlib.sha256(memoryview(data)[:end]).hexdigest().encode() == data[end + len(_STAMP_MAGIC):]
        return "ok" if ok else "mismatch"
    if len(data) >= _EOCD_LEN and data[-_EOCD_LEN:-_EOCD_LEN + 4] == _EOCD_SIG and data[-2:] == b"\0\0":
        return "absent"
    return "damaged"


def _has_stamp_magic(data: bytes) -> bool:
    return len(data) > _STAMP_LEN and data[-_STAMP_LEN:-_STAMP_LEN + len(_STAMP_MAGIC)] == _STAMP_MAGIC


def _describe_load_error(exc: Exception) -> str:
    """A one-line reason for a failed ``torch.load``."""
    msg = str(exc)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    first = lines[0][:200] if lines else type(exc).__name__
    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in msg:
        detail = next((ln for ln in lines if "Unsupported" in ln), "")
        detail = detail.replace("WeightsUnpickler error: ", "").split(". Please use")[0]
        return ("refused by torch.load(weights_only=True): it holds something other than tensors, numbers, "
                "strings, lists and dicts (a pickled object, or corrupt bytes)"
                + (f" [{detail}]" if detail else ""))
    if isinstance(exc, EOFError) or "central directory" in msg or "not a ZIP archive" in msg:
        return f"truncated or not a torch file ({first})"
    return f"corrupt ({type(exc).__name__}: {first})"


def _torch_load_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------------------------- training state
def _host_tree(obj: Any, where: str) -> Any:
    """A copy of ``obj`` with tensors detached on the CPU; refuses what weights_only loading refuses."""
    def tensor(t: torch.Tensor, at: str) -> torch.Tensor:
        if t.layout != torch.strided:
            raise TypeError(f"{at} is a {t.layout} tensor; store it dense (.to_dense())")
        return _compact(t.detach().cpu())

    def allowed(value: Any, at: str) -> Any:
        if type(value) not in _ALLOWED_STATE_TYPES:
            hint = " (use torch.from_numpy)" if isinstance(value, np.ndarray | np.generic) else ""
            raise TypeError(f"{at} is a {type(value).__module__}.{type(value).__qualname__}{hint}")
        return value

    return tree_map(tensor, obj, leaf=allowed, container=allowed, path=where)


def save_training_state(path: PathLike, state: dict[str, Any]) -> Path:
    """Atomically write a training state that ``torch.load(path, weights_only=True)`` can read.

    Tensors are moved to the CPU; the saved dict gets ``'__anysr__': {'format': 1, 'digest': ...}`` (the
    caller's dict is not modified) and the file a whole-file sha256 in its zip comment.
    """
    path = Path(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot save training state {path}: expected a dict, "
                              f"got {type(state).__name__}")
    body = {k: v for k, v in state.items() if k != _STATE_KEY}
    try:
        body = _host_tree(body, "state")
    except TypeError as exc:
        raise CheckpointError(
            f"cannot save training state {path}: {exc}, which torch.load(weights_only=True) cannot read "
            "back; store only tensors, numbers, strings, bytes, None, lists, tuples and dicts "
            "(e.g. obj.state_dict())"
        ) from None
    body[_STATE_KEY] = {"format": STATE_FORMAT, "digest": tree_digest(body)}
    return _save_stamped(path, body)


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
    stamp = _check_zip_stamp(data)
    if stamp == "mismatch":
        raise _Unusable("checksum mismatch: the file changed after it was written "
                        "(a flipped byte or a bad copy)")
    if stamp == "damaged":
        raise _Unusable("truncated or corrupt: the end of the archive is missing or damaged "
                        "(an interrupted copy, a full disk?)")
    try:
        obj = _torch_load_bytes(data)
    except Exception as exc:  # any failure of the unpickler means an unusable file
        raise _Unusable(_describe_load_error(exc)) from exc
    if not isinstance(obj, dict) or not isinstance(obj.get(_STATE_KEY), dict):
        raise _Unusable("not an anysr training state (no '__anysr__' record; "
                        "was it written by another tool?)")
    info = obj.pop(_STATE_KEY)
    if info.get("format") != STATE_FORMAT:
        raise _Unusable(f"unknown anysr training state format {info.get('format')!r} (this anysr reads "
                        f"format {STATE_FORMAT}): written by another anysr version, or corrupt")
    try:
        digest = tree_digest(obj)
    except TypeError as exc:
        raise _Unusable(f"corrupt ({exc})") from exc
    if digest != info.get("digest"):
        raise _Unusable("checksum mismatch: its content does not match the digest recorded when it was saved")
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
        m = _STATE_RE.match(entry.name)
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
    """Cheap check for pruning: a valid whole-file stamp, or (unstamped files) a full verified load."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    stamp = _check_zip_stamp(data)
    if stamp == "ok":
        return True
    if stamp != "absent":
        return False
    try:
        _read_training_state(path)
    except _Unusable:
        return False
    return True


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


# --------------------------------------------------------------------------------------------- weights
def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a copy when it is a view into a larger storage (torch.save would store it all)."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def _host_tensor(t: torch.Tensor, where: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"cannot save weights: {where} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise CheckpointError(f"cannot save weights: {where} is a {t.layout} tensor; store it dense")
    return _compact(t.detach().cpu().contiguous())


def _host_groups(groups: Mapping[str, Mapping[str, torch.Tensor]],
                 path: Path) -> dict[str, dict[str, torch.Tensor]]:
    if not isinstance(groups, Mapping) or not groups:
        raise CheckpointError(f"cannot save weights {path}: groups must be a non-empty dict like "
                              "{'params': net.state_dict()}")
    out: dict[str, dict[str, torch.Tensor]] = {}
    seen: set[int] = set()
    for group, sd in groups.items():
        if not isinstance(group, str) or not group or "." in group:
            raise CheckpointError(f"cannot save weights {path}: group name {group!r} must be a non-empty "
                                  "string without '.' (e.g. 'params', 'params_ema')")
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"cannot save weights {path}: group {group!r} is a {type(sd).__name__}, "
                                  "not a state dict")
        out[group] = {}
        for name, t in sd.items():
            t = _host_tensor(t, f"{group}.{name}")
            ptr = t.untyped_storage().data_ptr()
            if t.numel() and ptr in seen:
                t = t.clone()  # tied or repeated tensors: safetensors stores each one on its own
            seen.add(t.untyped_storage().data_ptr())
            out[group][str(name)] = t
    return out


def _metadata_digest(meta: Mapping[str, str], digests: Mapping[str, str], names: list[str]) -> str:
    """Digest of the metadata strings (but the digest record), the per-group digests and all tensor names."""
    return tree_digest({"metadata": {k: v for k, v in meta.items() if k != "digest"},
                        "groups": {k: v for k, v in digests.items() if k != "__metadata__"},
                        "names": sorted(names)})


def save_weights(path: PathLike, groups: Mapping[str, Mapping[str, torch.Tensor]],
                 metadata: Mapping[str, Any] | None = None) -> Path:
    """Atomically write ``groups`` (e.g. ``{'params': sd, 'params_ema': sd}``) as one ``.safetensors`` file.

    Tensors are named ``<group>.<param>``; each ``metadata`` value (``network_g`` options, ``scale``,
    ``iteration``, ...) is stored JSON-encoded next to ``anysr_format``, ``groups`` and a ``digest`` of
    the tensors and metadata, so the net can be rebuilt and verified from the file alone.
    """
    path = Path(path)
    host = _host_groups(groups, path)
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if key in _RESERVED_META:
            raise CheckpointError(f"cannot save weights {path}: metadata key '{key}' is reserved; rename it")
        try:
            meta[str(key)] = json.dumps(value, sort_keys=True, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"cannot save weights {path}: metadata '{key}' is not JSON-serialisable "
                                  f"({exc}); pass plain dicts, lists, strings and numbers") from None
    meta["anysr_format"] = json.dumps(WEIGHTS_FORMAT)
    meta["groups"] = json.dumps(list(host))
    digests = {g: tree_digest(sd) for g, sd in host.items()}
    tensors = {f"{g}.{name}": t for g, sd in host.items() for name, t in sd.items()}
    digests["__metadata__"] = _metadata_digest(meta, digests, list(tensors))
    meta["digest"] = json.dumps(digests, sort_keys=True)
    return atomic_write_bytes(path, safetensors_save(tensors, metadata=meta))


def save_weights_pth(path: PathLike, groups: Mapping[str, Mapping[str, torch.Tensor]]) -> Path:
    """Atomically write a BasicSR-compatible ``torch.save({'params': sd, 'params_ema': sd})`` file.

    The zip comment carries a whole-file sha256 that ``load_weights`` checks (torch and BasicSR ignore it).
    """
    path = Path(path)
    return _save_stamped(path, _host_groups(groups, path))


def _strip_wrapper_prefixes(sd: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """Drop leading ``module.`` (DDP) / ``_orig_mod.`` (torch.compile) from every name."""
    out: dict[str, Any] = {}
    for name, value in sd.items():
        key = str(name)
        stripped = True
        while stripped:
            stripped = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix):]
                    stripped = True
        if key in out:
            raise CheckpointError(f"weights {path}: '{name}' and another entry both become '{key}' once "
                                  "the DDP/compile prefixes are removed; the file mixes wrapped and "
                                  "unwrapped names. Fix: re-export it from the unwrapped network")
        out[key] = value
    return out


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _pick_group(available: list[str], param_key: str, path: Path, extra: tuple[str, ...] = (),
                key_option: str = "path.param_key_g") -> str:
    """The group to load: ``param_key``; ``params_ema`` falls back to ``params``; ``params`` to ``extra``."""
    if param_key in available:
        return param_key
    if param_key == "params_ema" and "params" in available:
        logger.info("%s holds no 'params_ema' (EMA) weights, as Real-ESRGAN's releases; loading 'params'", path)
        return "params"
    for alt in extra:
        if alt in available:
            if param_key == "params_ema":
                logger.info("%s holds no 'params_ema' (EMA) weights; loading '%s'", path, alt)
            return alt
    listed = ", ".join(repr(k) for k in available) or "none"
    raise CheckpointError(f"weights {path} have no '{param_key}' entry; it holds: {listed}. "
                          f"Fix: set {key_option} to one of them")


def _weights_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pth", ".pt", ".ckpt", ".bin"):
        return "torch"
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as exc:
        raise CheckpointError(f"cannot read weights {path}: {exc}") from exc
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise CheckpointError(f"weights {path}: unknown format; expected a .safetensors, .pth, .pt or .ckpt file")


def _decode_metadata(raw: Mapping[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        if key == "digest":
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a plain string from another tool
    return out


def _checked_anysr_meta(raw_meta: Mapping[str, str], names: list[str],
                        path: Path) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """``(groups, recorded digests, decoded metadata)`` of one of our files, after checking that the
    metadata, the digest record and the tensor names agree (a flipped byte in the header is refused)."""
    def corrupt(what: str) -> CheckpointError:
        return CheckpointError(f"weights {path} are corrupt: {what} (the file changed after it was "
                               f"written). {_WEIGHTS_FIX}")

    if any(key not in raw_meta for key in _RESERVED_META):
        raise corrupt("part of the anysr header is missing")
    try:
        fmt = json.loads(raw_meta["anysr_format"])
        groups = json.loads(raw_meta["groups"])
        digests = json.loads(raw_meta["digest"])
    except ValueError:
        raise corrupt("the anysr header does not parse") from None
    if not (isinstance(groups, list) and groups and all(isinstance(g, str) for g in groups)
            and isinstance(digests, dict) and set(digests) == {*groups, "__metadata__"}):
        raise corrupt("the group list and the digest record disagree")
    if fmt != WEIGHTS_FORMAT:
        raise CheckpointError(f"weights {path}: unknown anysr weights format {fmt!r} (this anysr reads "
                              f"format {WEIGHTS_FORMAT}): written by another anysr version, or corrupt. "
                              f"{_WEIGHTS_FIX}")
    if digests["__metadata__"] != _metadata_digest(raw_meta, digests, names):
        raise corrupt("checksum mismatch in the metadata")
    stray = [n for n in names if n.split(".", 1)[0] not in groups]
    if stray:
        raise corrupt(f"tensor name {stray[0]!r} belongs to none of the groups {groups}")
    return groups, digests, _decode_metadata(raw_meta)


def _load_safetensors(path: Path, param_key: str | None,
                      key_option: str = "path.param_key_g") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of ``param_key`` (all of them for a foreign file; none when None) and the metadata."""
    group = None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw_meta = f.metadata() or {}
            names = list(f.keys())
            if not any(key in raw_meta for key in _RESERVED_META):  # a plain file from another tool
                sd = {n: f.get_tensor(n) for n in names} if param_key is not None else {}
                return sd, _decode_metadata(raw_meta)
            groups, digests, meta = _checked_anysr_meta(raw_meta, names, path)
            if param_key is None:
                return {}, meta
            group = _pick_group(groups, param_key, path, key_option=key_option)
            prefix = group + "."
            sd = {n[len(prefix):]: f.get_tensor(n) for n in names if n.startswith(prefix)}
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types for bad headers and short files
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"weights {path} are truncated or corrupt ({type(exc).__name__}: {msg}). "
                              f"{_WEIGHTS_FIX}") from exc
    if digests[group] != tree_digest(sd):
        raise CheckpointError(f"weights {path}: checksum mismatch in '{group}' (the file changed "
                              f"after it was written). {_WEIGHTS_FIX}")
    return sd, meta


def _stored_zip(f: BinaryIO) -> bool:
    """Whether ``f`` is a zip archive whose records are all stored uncompressed, as ``torch.save`` writes them.

    ``torch.load`` with ``mmap=True`` reads each record at its offset in the file, so a legacy (pre-1.6) file or an
    archive re-zipped with compression must be read the ordinary way (mapped, it would give wrong values).
    """
    if f.read(4) != b"PK\x03\x04":
        return False
    try:
        with zipfile.ZipFile(f) as zf:
            return all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, struct.error):
        return False  # torch.load says what is wrong with it


def _scan_torch_file(path: Path) -> tuple[str, bool]:
    """``(stamp status, can be memory-mapped)`` of a torch file, read through a memory map (no copy in memory)."""
    try:
        with open(path, "rb") as f:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
            mappable = _stored_zip(f)
    except OSError as exc:
        raise CheckpointError(f"cannot read weights {path}: {exc}") from exc
    try:
        return (_check_zip_stamp(data) if _has_stamp_magic(data) else "absent"), mappable
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _check_zip_crcs(path: Path) -> None:
    """A foreign ``.pth`` carries no stamp of ours: verify the CRC-32 its zip records hold (one sequential read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, struct.error, zlib.error):
        return  # not a readable zip: torch.load says what is wrong with it
    if bad is not None:
        raise CheckpointError(f"weights {path} are corrupt: the record '{bad}' fails its zip CRC check (a damaged "
                              f"download or copy). {_WEIGHTS_FIX}")


def _load_torch_weights(path: Path, param_key: str, key_option: str = "path.param_key_g") -> dict[str, torch.Tensor]:
    stamp, mappable = _scan_torch_file(path)
    if stamp != "absent" and stamp != "ok":
        what = "checksum mismatch" if stamp == "mismatch" else "truncated or corrupt end of archive"
        raise CheckpointError(f"weights {path}: {what} (the file changed after it was written). "
                              f"{_WEIGHTS_FIX}")
    if stamp == "absent":
        _check_zip_crcs(path)
    try:
        # torch.save archives are memory-mapped: tensors are views of the page cache, shared by every process
        # reading the file, and only the group loaded into the net is ever touched.
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mappable)
    except Exception as exc:  # any unpickler failure means an unusable file
        raise CheckpointError(f"weights {path} cannot be loaded: {_describe_load_error(exc)}. "
                              f"{_WEIGHTS_FIX}") from exc
    if _is_state_dict(obj):
        return dict(obj)
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"weights {path} hold a {type(obj).__name__}, not a state dict. "
                              f"{_WEIGHTS_FIX}")
    if _STATE_KEY in obj:
        raise _training_state_given(path)
    available = [str(k) for k, v in obj.items() if _is_state_dict(v)]
    group = _pick_group(available, param_key, path, extra=("state_dict",), key_option=key_option)
    return dict(obj[group])


def _training_state_given(path: Path) -> CheckpointError:
    models = path.parent.parent / "models"
    return CheckpointError(f"{path} is a training state (what --auto_resume / path.resume_state continue from), "
                           f"not network weights; the weights saved with it are {models}/net_g_<iteration>."
                           "safetensors (and net_g_latest.safetensors)")


def _check_finite(sd: Mapping[str, torch.Tensor], path: Path) -> None:
    """Refuse weights holding NaN or infinity (a broken training run or a damaged file), naming the tensor."""
    for name, t in sd.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"weights {path}: tensor '{name}' holds NaN or infinite values; the network "
                                  f"would output garbage. {_WEIGHTS_FIX}")


def load_weights(path: PathLike, param_key: str = "params", *,
                 key_option: str = "path.param_key_g") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read network weights on the CPU: ``(state_dict, metadata)``.

    ``.safetensors`` (ours: the ``param_key`` group, verified; any other: all tensors) are memory-mapped
    through ``safe_open``; ``.pth``/``.pt``/``.ckpt`` (BasicSR ``{'params', 'params_ema'}``, a bare state dict,
    or a ``state_dict`` entry) go through ``torch.load(weights_only=True, mmap=True)``, legacy pre-1.6 files
    without ``mmap``. The tensors are views of the file's pages: copy them into the net (``load_into``) and
    drop them. ``params_ema`` falls back to ``params`` (one info line). Leading ``module.`` / ``_orig_mod.``
    are stripped from the names. Foreign ``.pth`` archives are checked against their zip CRCs, and weights
    holding NaN or infinity are refused. ``key_option`` names the option that sets ``param_key`` in errors.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weights {path} do not exist. {_WEIGHTS_FIX}")
    if not path.is_file():
        raise CheckpointError(f"weights {path} is not a file; point the option at a .safetensors "
                              "or .pth file")
    if _STATE_RE.match(path.name):
        raise _training_state_given(path)
    if _weights_kind(path) == "safetensors":
        sd, meta = _load_safetensors(path, param_key, key_option)
    else:
        sd, meta = _load_torch_weights(path, param_key, key_option), {}
    _check_finite(sd, path)
    return _strip_wrapper_prefixes(sd, path), meta


def read_weights_metadata(path: PathLike) -> dict[str, Any]:
    """The decoded metadata of a ``.safetensors`` weights file (checked against its digest when ours);
    ``{}`` for ``.pth`` files, which carry none."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights {path} do not exist or are not a file. {_WEIGHTS_FIX}")
    if _weights_kind(path) != "safetensors":
        return {}
    return _load_safetensors(path, None)[1]


# --------------------------------------------------------------------------------------------- into a network
def _first(names: list[str], n: int = 10) -> str:
    shown = ", ".join(names[:n])
    return shown + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def state_dict_mismatch(own: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """How ``theirs`` differs from ``own`` (missing / unexpected keys, shape mismatches, first few of each),
    and the names whose shapes differ."""
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    bad: dict[str, str] = {}
    for k, mine in own.items():
        other = theirs.get(k)
        if isinstance(mine, torch.Tensor) and isinstance(other, torch.Tensor) and other.shape != mine.shape:
            bad[k] = f"{k}: file {tuple(other.shape)} vs network {tuple(mine.shape)}"
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_first(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_first(unexpected)}")
    if bad:
        problems.append(f"shape mismatches ({len(bad)}): {_first(list(bad.values()))}")
    return problems, set(bad)


def load_into(net: nn.Module, state_dict: Mapping[str, Any], *, strict: bool, source: str,
              fix: str = "check that network_g matches the file, or set path.strict_load_g: false to load "
                         "what matches") -> None:
    """Load ``state_dict`` into ``net``.

    Missing / unexpected keys or shape mismatches raise CheckpointError naming ``source`` when ``strict``;
    otherwise the tensors whose name and shape match are loaded and the rest is logged as skipped
    (loading nothing at all is still an error: the file is for another network).
    """
    own = net.state_dict()
    problems, bad = state_dict_mismatch(own, state_dict)
    if strict:
        if problems:
            raise CheckpointError(f"{source} does not fit the network: " + "; ".join(problems) + f". Fix: {fix}")
        net.load_state_dict(dict(state_dict), strict=True)
        return
    matching = {k: v for k, v in state_dict.items() if k in own and k not in bad}
    if own and not matching:
        raise CheckpointError(f"{source}: none of its {len(state_dict)} entries match the network's "
                              f"{len(own)} (file: {_first(list(state_dict), 3)}; network: "
                              f"{_first(list(own), 3)}). Fix: check network_g and the file")
    net.load_state_dict(matching, strict=False)
    if problems:
        logger.warning("%s: loaded %d of %d network tensors; skipped %s", source, len(matching), len(own),
                       "; ".join(problems))
