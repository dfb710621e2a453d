"""The random draws of the batch augmentations (``train.use_moa``), from a counter: nothing is kept between steps.

One augmentation is drawn per global micro-batch from ``(manual_seed, iteration, micro)`` with the ``moa_probs``
weights (the same on every rank); each sample's parameters (mixing weight, box) from ``(manual_seed, iteration,
micro, global sample index)``. A sample is mixed with its neighbour in the global batch (index ``g ^ 1``: samples
0-1, 2-3, ...; the sampler's shuffle makes the pairs random). So training resumes exactly, and ``R`` ranks of ``B``
samples equal one process of ``R * B`` whenever ``B`` is even (with an odd ``B`` the last sample of each rank's
batch is mixed with itself, i.e. kept).

Parameter ranges are traiNNer-redux's: mixup ``lam ~ U(0.4, 0.6)``; cutmix a box of side ``sqrt(1 - lam)``
of the image, ``lam ~ U(0, 0.9)``; resizemix a box of side ``tau ~ U(0.5, 0.9)``; cutblur ``U(0.2, 0.7)``;
boxes centred uniformly on an LQ pixel and clipped to the image. The operators are :mod:`anysr.ops.augment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from anysr.data.degradation.draws import categorical
from anysr.errors import DataError
from anysr.ops.augment import AUGMENTS, AugmentDraw, apply_augment

__all__ = ["BatchAugment", "draw_augment"]

_TAG = 0x6D6F61  # 'moa': keeps these streams apart from every other counter stream of the same seed
MIXING = ("mixup", "cutmix", "resizemix")  # the kinds that mix two samples of a batch


@dataclass(frozen=True)
class BatchAugment:
    """``augs`` drawn with weights ``probs`` for each micro-batch of training (``train.use_moa``)."""

    augs: tuple[str, ...]
    probs: tuple[float, ...]
    seed: int
    one_graph: bool = False  # compute every kind that can be drawn and select (XLA); else only the drawn one

    @classmethod
    def from_options(cls, train: Any, seed: int, *, one_graph: bool = False) -> BatchAugment:
        """From the validated ``train`` section (``moa_augs``, ``moa_probs``). ``one_graph``: the accelerator
        compiles per shape and graph (XLA); the result is the same either way, bit for bit."""
        return cls(tuple(train["moa_augs"]), tuple(float(p) for p in train["moa_probs"]), int(seed), one_graph)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The augmentations that can be drawn (weight > 0)."""
        return tuple(a for a, p in zip(self.augs, self.probs, strict=True) if p > 0)

    @property
    def mixes(self) -> bool:
        """Whether a drawn augmentation mixes two samples (then a batch needs two)."""
        return any(k in MIXING for k in self.kinds)

    def draw(self, iteration: int, micro: int, first_index: int, batch: int, channels: int,
             lq_size: tuple[int, int]) -> AugmentDraw:
        return draw_augment(self.augs, self.probs, self.seed, iteration, micro, first_index, batch, channels,
                            lq_size)

    def __call__(self, batch: dict[str, Any], iteration: int, micro: int, first_index: int,
                 gt_keys: Sequence[str] = ("gt",)) -> dict[str, Any]:
        """The micro-batch with ``lq`` and the GT-sized targets ``gt_keys`` (those present) augmented; other keys
        as they were. ``first_index``: the global index of the batch's first sample (rank * local batch)."""
        if "lq" not in batch or "gt" not in batch:
            raise DataError(f"train.use_moa augments LQ/GT pairs; this batch has {', '.join(map(str, batch))}")
        lq = batch["lq"]
        if lq.ndim != 4:
            raise DataError(f"train.use_moa augments image batches (B, C, H, W); got an LQ of shape "
                            f"{tuple(lq.shape)} (video clips are not supported)")
        keys = [k for k in gt_keys if k in batch]
        draw = self.draw(iteration, micro, first_index, int(lq.shape[0]), int(lq.shape[1]),
                         (int(lq.shape[-2]), int(lq.shape[-1])))
        kinds = self.kinds if self.one_graph else (AUGMENTS[int(draw.kind[0])],)  # a host tensor: no sync
        with torch.no_grad():
            try:
                new_lq, new_gts = apply_augment(lq, [batch[k] for k in keys], draw.to(lq.device), kinds)
            except ValueError as exc:
                raise DataError(f"train.use_moa: {exc}") from None
        return {**batch, "lq": new_lq, **dict(zip(keys, new_gts, strict=True))}


def _box(rng: np.random.Generator, size: tuple[int, int], side: float) -> list[int]:
    """A box of ``side`` of the image centred on a uniform pixel, clipped: ``[y0, x0, y1, x1]``."""
    h, w = size
    ch, cw = int(h * side), int(w * side)
    cy, cx = int(rng.integers(h)), int(rng.integers(w))
    return [min(max(cy - ch // 2, 0), h), min(max(cx - cw // 2, 0), w),
            min(max(cy + ch // 2, 0), h), min(max(cx + cw // 2, 0), w)]


def draw_augment(augs: Sequence[str], probs: Sequence[float], seed: int, iteration: int, micro: int,
                 first_index: int, batch: int, channels: int, lq_size: tuple[int, int]) -> AugmentDraw:
    """The draws (CPU tensors) of micro-batch ``micro`` of ``iteration`` for samples ``first_index ...
    first_index + batch - 1`` of the global batch."""
    name = augs[categorical(np.random.default_rng([int(seed), _TAG, int(iteration), int(micro)]), probs)]
    code = AUGMENTS.index(name)
    h, w = lq_size
    lam = np.ones(batch, dtype=np.float32)
    box = np.zeros((batch, 4), dtype=np.int64)
    perm = np.tile(np.arange(channels, dtype=np.int64), (batch, 1))
    for i in range(batch):
        rng = np.random.default_rng([int(seed), _TAG, int(iteration), int(micro), int(first_index + i)])
        if name == "mixup":
            lam[i] = rng.uniform(0.4, 0.6)
            box[i] = [0, 0, h, w]
        elif name == "cutmix":
            box[i] = _box(rng, lq_size, float(np.sqrt(1.0 - rng.uniform(0.0, 0.9))))
        elif name == "resizemix":
            box[i] = _box(rng, lq_size, rng.uniform(0.5, 0.9))
        elif name == "cutblur":
            box[i] = _box(rng, lq_size, rng.uniform(0.2, 0.7))
        elif name == "rgb" and channels > 1:
            while (perm[i] == np.arange(channels)).all():  # a permutation that changes something
                perm[i] = rng.permutation(channels)
    local = np.arange(batch)
    partner = np.where((local ^ 1) < batch, local ^ 1, local)
    return AugmentDraw(torch.full((batch,), code, dtype=torch.int64), torch.from_numpy(lam), torch.from_numpy(box),
                       torch.from_numpy(partner.astype(np.int64)), torch.from_numpy(perm))
