"""DISTS on the image as given: neosr's ``dists_loss`` / ``calculate_dists``.

Identical to ``anysr.metrics.dists.DISTS`` (same VGG16 with L2 pooling, same ``alpha`` / ``beta`` head, same weight
files and state-dict names) except that the VGG16 sees the [0, 1] RGB image itself, not the ImageNet-normalised
one: neosr's DISTS leaves the normalisation out, which changes every value. Use ``dists`` for the paper's numbers
and ``raw_dists`` to reproduce neosr's. Lower is better; one value per pair, a tensor ``(N,)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from anysr.metrics.backbones import run_slices
from anysr.metrics.dists import DISTS
from anysr.metrics.info import RAW_DISTS_INFO

__all__ = ["RawDISTS", "METRIC_INFO", "BETTER"]

METRIC_INFO = RAW_DISTS_INFO
BETTER = METRIC_INFO.better


class RawDISTS(DISTS):
    """DISTS without the input's ImageNet normalisation (neosr's): two RGB batches on [0, 1] -> ``(N,)``.

    Weights as ``DISTS`` (torchvision's vgg16 and DISTS' ``alpha`` / ``beta``, e.g. neosr's dists_weights.pth, or
    one DISTS state dict); the ``mean`` / ``std`` buffers are kept (so the state dicts are interchangeable) and
    not applied.
    """

    def features(self, x: Tensor) -> list[Tensor]:
        """The image and the five stages' outputs, the first stage fed the image as it is. ``forward`` hands over
        the two batches stacked; they go through the VGG one after the other, as in neosr (one batch of twice the
        size takes other convolution kernels, whose rounding can flip ReLUs near 0 and move a gradient entry)."""
        stages = [self.stage1, self.stage2, self.stage3, self.stage4, self.stage5]
        n = x.shape[0] // 2
        if 2 * n != x.shape[0]:
            return [x, *run_slices(x, stages)]
        first, second = run_slices(x[:n], stages), run_slices(x[n:], stages)
        return [x, *(torch.cat(pair) for pair in zip(first, second, strict=True))]
