"""The integrity checks: a sha256 of the whole file in the zip comment of ``torch.save`` archives (training
states, BasicSR .pth written by anysr), and a canonical digest of tensors for the metadata of .safetensors files
(which have no room for a trailer). Either way a flipped byte or a truncated copy is refused."""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from anysr.atomic import atomic_write

ALLOWED_STATE_TYPES = (dict, OrderedDict, list, tuple, torch.Size, set, str, int, float, complex, bool,
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


def save_stamped(path: Path, obj: Any) -> Path:
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


def check_zip_stamp(data: bytes) -> str:
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


def has_stamp_magic(data: bytes) -> bool:
    return len(data) > _STAMP_LEN and data[-_STAMP_LEN:-_STAMP_LEN + len(_STAMP_MAGIC)] == _STAMP_MAGIC


def describe_load_error(exc: Exception) -> str:
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


def torch_load_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
