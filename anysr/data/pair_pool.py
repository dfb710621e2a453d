"""Real-ESRGAN's training-pair pool (``queue_size``): it mixes synthesised pairs of different batches.

The pool's contents are training state; its picks come from
:func:`anysr.data.degradation.realesrgan.pool_rng`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anysr.errors import CheckpointError, OptionError

__all__ = ["TrainingPairPool", "quantise", "dequantise", "wide_keys"]


def quantise(x: Tensor) -> Tensor:
    """A tensor of 8-bit levels ``k / 255`` as uint8 (exact: ``dequantise`` gives the same floats back)."""
    return torch.clamp((x * 255.0).round(), 0, 255).to(torch.uint8)


def dequantise(x: Tensor) -> Tensor:
    """uint8 levels as float32 ``k / 255`` (the values image decoding and ``clamp_round`` produce)."""
    return x.to(torch.float32) / 255.0


def wide_keys(batch: Mapping[str, Any]) -> tuple[str, ...]:
    """The pool keys a batch holds off the 8-bit levels: ``('gt',)`` when any of its GT images is 16-bit (the
    datasets' host-side ``bits``; no device read), else none. The synthesised LQ is always on 8-bit levels."""
    return ("gt",) if any(int(b) == 16 for b in batch.get("bits", ())) else ()


class TrainingPairPool:
    """Real-ESRGAN's training-pair pool (``queue_size``), which mixes samples of different batches.

    The pool has ``rows = queue_size // batch`` rows of one batch each. While it fills, each batch goes into the
    next row and trains as it is. Once full, every batch position ``j`` trains on the sample of a random row of
    its column and leaves its new sample in that place. BasicSR shuffles the whole pool and takes ``batch``
    entries instead; both replace ``batch / queue_size`` of the pool per step (the same age distribution), but a
    column per batch position lets a global batch split over ranks keep exactly one process's pool: rank ``r``
    holds the columns of its slice of the global batch. Picks come from
    :func:`anysr.data.degradation.realesrgan.pool_rng`.

    Entries are stored as uint8 where they are 8-bit images (``exact_8bit``: the LQ always, the GT unless it was
    sharpened), which is exact and 4x smaller than float32. A key a batch names ``wide`` (a 16-bit GT, whose
    levels uint8 cannot hold) is stored as float32 from then on: its uint8 entries are converted exactly.
    """

    def __init__(self, queue_size: int, exact_8bit: Mapping[str, bool]) -> None:
        self.queue_size = int(queue_size)
        self.exact_8bit = dict(exact_8bit)
        self.rows = 0
        self.filled = 0
        self.data: dict[str, Tensor] = {}
        self._pending: dict[str, Any] | None = None

    def _widen(self, k: str) -> None:
        """Store ``k`` as float32 from now on (its uint8 entries converted exactly)."""
        if self.exact_8bit.get(k):
            self.exact_8bit[k] = False
            if k in self.data:
                self.data[k] = dequantise(self.data[k])

    def _create(self, batch: Mapping[str, Tensor]) -> None:
        b = next(iter(batch.values())).shape[0]
        if self.queue_size % b:
            raise OptionError(f"queue_size: {self.queue_size} is not a multiple of the batch per device ({b}); "
                              f"use e.g. {max(1, self.queue_size // b) * b}")
        self.rows = self.queue_size // b
        for k, v in batch.items():
            dtype = torch.uint8 if self.exact_8bit[k] else v.dtype
            self.data[k] = torch.zeros((self.rows, *v.shape), dtype=dtype, device=v.device)
        if self._pending is not None:
            self._restore(self._pending)
            self._pending = None

    def _store(self, k: str, v: Tensor) -> Tensor:
        return quantise(v) if self.exact_8bit[k] else v

    def _load(self, k: str, v: Tensor) -> Tensor:
        return dequantise(v) if self.exact_8bit[k] else v

    @property
    def full(self) -> bool:
        return self.rows > 0 and self.filled == self.rows

    def swap(self, batch: Mapping[str, Tensor], rng: np.random.Generator, *, offset: int, global_batch: int,
             to_device: Callable[[Tensor], Tensor], wide: Collection[str] = ()) -> dict[str, Tensor]:
        """Put ``batch`` (same keys every call; columns ``offset .. offset + B`` of the global batch) into the pool
        and return what trains now. ``rng`` draws the rows of all ``global_batch`` columns (the same on every
        rank); ``to_device`` uploads the index tensors (data, not constants: one graph on XLA for every step).
        ``wide``: keys whose values in this batch are not on 8-bit levels (16-bit images): stored as float32."""
        for k in wide:
            self._widen(k)
        if not self.data:
            self._create(batch)
        b = next(iter(batch.values())).shape[0]
        if not self.full:
            row = to_device(torch.tensor([self.filled], dtype=torch.long))
            for k, v in batch.items():
                self.data[k].index_copy_(0, row, self._store(k, v).unsqueeze(0))
            self.filled += 1
            return dict(batch)
        picks = rng.integers(0, self.rows, size=global_batch)[offset: offset + b]
        rows = to_device(torch.from_numpy(picks.astype(np.int64)))
        cols = to_device(torch.arange(b, dtype=torch.long))
        out = {}
        for k, v in batch.items():
            out[k] = self._load(k, self.data[k][rows, cols])
            self.data[k][rows, cols] = self._store(k, v)
        return out

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self, gather: Callable[[Any], list[Any]], to_host: Callable[[Any], Any]) -> dict[str, Any]:
        """The whole pool of every rank, columns in global order: ``{'filled', 'rows', 'data': {key: tensor
        (rows, global batch, ...)}}``. ``gather`` is the accelerator's ``all_gather_object`` (every rank calls)."""
        if not self.data and self._pending is not None:  # loaded, not used yet: what was loaded
            local, filled = dict(self._pending["data"]), int(self._pending["filled"])
            rows = int(next(iter(local.values())).shape[0])
        else:
            local, filled, rows = to_host(self.data), self.filled, self.rows
        parts = gather(local)
        data = {}
        for k in local:  # a rank that saw a 16-bit batch stores the key as float32: the others' uint8 converts exactly
            vals = [p[k] for p in parts]
            if len({v.dtype for v in vals}) > 1:
                vals = [dequantise(v) if v.dtype == torch.uint8 else v for v in vals]
            data[k] = torch.cat(vals, dim=1)
        return {"filled": filled, "rows": rows, "data": data}

    def load_state_dict(self, state: Mapping[str, Any], *, offset: int, batch: int, where: str = "the state") -> None:
        """Take this rank's columns ``offset .. offset + batch`` of a saved pool (the pool is built on the first
        batch, so the device copy happens then)."""
        if not state["data"]:
            return
        rows = int(state["rows"])
        if self.queue_size != rows * batch:
            raise CheckpointError(f"{where} holds a pair pool of {rows} rows x {batch} (queue_size {rows * batch} "
                                  f"per device) but queue_size is {self.queue_size} now; restore queue_size "
                                  "(or start a new run)")
        sizes = {int(v.shape[1]) for v in state["data"].values()}
        if any(offset + batch > n for n in sizes):
            raise CheckpointError(f"{where}: its pair pool holds {sizes} columns, fewer than this rank needs "
                                  f"({offset + batch}); resume with the global batch it was saved with")
        self._pending = {"filled": int(state["filled"]),
                         "data": {k: v[:, offset: offset + batch].contiguous() for k, v in state["data"].items()}}

    def _restore(self, pending: Mapping[str, Any]) -> None:
        for k, v in pending["data"].items():
            if k in self.data and v.dtype != self.data[k].dtype and torch.uint8 in (v.dtype, self.data[k].dtype):
                self._widen(k)  # one side held 16-bit images: float32 holds both exactly
                if v.dtype == torch.uint8:
                    v = dequantise(v)
            if k not in self.data or tuple(v.shape) != tuple(self.data[k].shape) or v.dtype != self.data[k].dtype:
                raise CheckpointError(f"the saved pair pool's '{k}' entries ({tuple(v.shape)}, {v.dtype}) do not fit "
                                      f"this run's ({tuple(self.data[k].shape) if k in self.data else 'none'}); "
                                      "restore gt_size, scale and queue_size (or start a new run)")
            self.data[k].copy_(v.to(self.data[k].device))
        self.filled = int(pending["filled"])

