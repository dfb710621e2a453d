"""DISTS (Ding et al., 2020): deep image structure and texture similarity, equal to ``DISTS_pytorch.DISTS``.

``DISTS()`` compares two batches of RGB images on [0, 1] (DISTS' own range). VGG16 with its max pools
replaced by L2 pooling (a 3x3 Hann-weighted root-mean-square, stride 2) gives six feature sets: the image
itself and the five ReLU stages (relu1_2 ... relu5_3) of the ImageNet-normalised image. Per channel, with
global means ``m``, variances ``v`` and covariance ``c`` (over the whole image),

    texture   S1 = (2 m_x m_y + c1) / (m_x^2 + m_y^2 + c1),      structure S2 = (2 c_xy + c2) / (v_x + v_y + c2)

(c1 = c2 = 1e-6) are weighted by the learned ``alpha`` / ``beta`` (normalised to sum to one together) and
``DISTS = 1 - sum(alpha S1 + beta S2)``: one value per pair, a tensor ``(N,)``. Lower is better.

Weights from the caller: torchvision's ``vgg16`` state dict (``features.N.weight``) and DISTS' ``weights.pt``
(``alpha``, ``beta`` of shape (1, 1475, 1, 1)), or one ``DISTS_pytorch.DISTS`` state dict, whose names this
module shares (``stage{k}.N.weight``, ``stage{k}.N.filter``, ``mean``, ``std``, ``alpha``, ``beta``).
The statistics are taken in float32 even under autocast.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.errors import CheckpointError, DataError
from anysr.metrics.backbones import (
    VGG16_SLICES,
    FrozenMetricNet,
    build_slices,
    run_slices,
    split_torchvision_keys,
    torchvision_to_sliced,
    vgg16_layers,
)
from anysr.metrics.info import DISTS_INFO

__all__ = ["CHANNELS", "DISTS", "DISTSTrunk", "L2pooling", "dists_state_dict", "METRIC_INFO", "BETTER"]

METRIC_INFO = DISTS_INFO
BETTER = METRIC_INFO.better

CHANNELS = (3, 64, 128, 256, 512, 512)  # the image's and each VGG stage's channels
_POOLS = {4: 64, 9: 128, 16: 256, 23: 512}  # VGG16 max-pool index -> channels of the L2 pooling there
_C1 = 1e-6
_C2 = 1e-6


class L2pooling(nn.Module):
    """Root of a depthwise 3x3 Hann-weighted mean of squares, stride 2, padding 1 (DISTS' anti-aliased pool).

    The weights ``filter`` (C, 1, 3, 3) are ``[1, 2, 1]^T [1, 2, 1] / 16`` (the inner taps of a 5-point Hann
    window), a buffer because DISTS saves it.
    """

    def __init__(self, filter_size: int = 5, stride: int = 2, channels: int = 64, pad_off: int = 0) -> None:
        super().__init__()
        if filter_size != 5:
            raise ValueError(f"L2pooling: only filter_size=5 (DISTS') is supported, got {filter_size}")
        self.padding = (filter_size - 2) // 2
        self.stride = stride
        self.channels = channels
        taps = torch.tensor([1.0, 2.0, 1.0])
        kernel = torch.outer(taps, taps) / 16.0
        self.register_buffer("filter", kernel.expand(channels, 1, 3, 3).clone())

    def forward(self, x: Tensor) -> Tensor:
        sq = x * x
        out = F.conv2d(sq, self.filter.to(sq.dtype), stride=self.stride, padding=self.padding, groups=sq.shape[1])
        return (out + 1e-12).sqrt()


class DISTSTrunk(FrozenMetricNet):
    """DISTS' VGG16 (five stages, max pools replaced by L2 pooling) behind ImageNet normalisation: what DISTS and
    A-DISTS (``anysr.losses.adists``) compare. Subclasses add their heads and freeze."""

    def __init__(self) -> None:
        super().__init__()
        pools = {i: L2pooling(channels=c) for i, c in _POOLS.items()}
        for k, block in enumerate(build_slices(vgg16_layers(), VGG16_SLICES, replace=pools), start=1):
            self.add_module(f"stage{k}", block)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, -1, 1, 1))

    def features(self, x: Tensor) -> list[Tensor]:
        """The image and the five stages' outputs (``CHANNELS`` channels)."""
        stages = [self.stage1, self.stage2, self.stage3, self.stage4, self.stage5]
        return [x, *run_slices((x - self.mean) / self.std, stages)]


class DISTS(DISTSTrunk):
    """DISTS between two batches of RGB images on [0, 1] -> tensor ``(N,)`` (lower is better).

    ``vgg``: torchvision vgg16 state dict; ``alpha_beta``: DISTS' ``weights.pt`` (``alpha``, ``beta``);
    give both, or neither and call ``load_weights`` (which also takes a whole DISTS state dict) later.
    Parameters are frozen; always in eval mode.
    """

    def __init__(self, vgg: Mapping[str, Tensor] | None = None, alpha_beta: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        self.chns = list(CHANNELS)
        self.alpha = nn.Parameter(torch.full((1, sum(CHANNELS), 1, 1), 0.1))
        self.beta = nn.Parameter(torch.full((1, sum(CHANNELS), 1, 1), 0.1))
        self.freeze()
        if vgg is not None or alpha_beta is not None:
            self.load_weights(*(sd for sd in (vgg, alpha_beta) if sd is not None))

    def load_weights(self, *state_dicts: Mapping[str, Tensor]) -> DISTS:
        """Load VGG16 + alpha/beta from state dicts in any layout ``dists_state_dict`` accepts; the fixed
        buffers (``mean``, ``std``, pooling filters) are kept when absent. Every parameter must be covered."""
        merged: dict[str, Tensor] = {}
        for sd in state_dicts:
            merged.update(dists_state_dict(sd))
        missing = sorted(name for name, _ in self.named_parameters() if name not in merged)
        self.load_checked(merged, missing, "DISTS", "give torchvision's vgg16 state dict (features.N.*) and "
                          "DISTS' weights.pt (alpha, beta)")
        return self

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape != y.shape or x.shape[1] != 3:
            raise DataError(f"DISTS: expected two RGB batches (N, 3, H, W) of the same shape on [0, 1], got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}")
        n = x.shape[0]
        feats = self.features(torch.cat([x, y]))
        alpha = self.alpha.to(torch.float32)
        beta = self.beta.to(torch.float32)
        total = alpha.sum() + beta.sum()
        alphas = torch.split(alpha / total, self.chns, dim=1)
        betas = torch.split(beta / total, self.chns, dim=1)
        texture = structure = None
        for f, a, b in zip(feats, alphas, betas):
            f = f.to(torch.float32)
            fx, fy = f[:n], f[n:]
            mx = fx.mean(dim=(2, 3), keepdim=True)
            my = fy.mean(dim=(2, 3), keepdim=True)
            s1 = (2 * mx * my + _C1) / (mx * mx + my * my + _C1)
            vx = (fx - mx).square().mean(dim=(2, 3), keepdim=True)
            vy = (fy - my).square().mean(dim=(2, 3), keepdim=True)
            cxy = (fx * fy).mean(dim=(2, 3), keepdim=True) - mx * my
            s2 = (2 * cxy + _C2) / (vx + vy + _C2)
            t = (a * s1).sum(dim=1)
            s = (b * s2).sum(dim=1)
            texture = t if texture is None else texture + t
            structure = s if structure is None else structure + s
        assert texture is not None and structure is not None
        return 1 - (texture + structure).flatten()


def dists_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename a state dict to ``DISTS``' keys: torchvision ``features.N.*`` (``classifier.*`` dropped),
    ``alpha`` / ``beta``, or a whole ``DISTS_pytorch.DISTS`` state dict; ``module.`` prefixes are stripped."""
    out: dict[str, Tensor] = {}
    tv, rest = split_torchvision_keys(state_dict)
    for key, k, value in rest:
        if k in ("alpha", "beta", "mean", "std") or k.startswith("stage"):
            out[k] = value
        else:
            raise CheckpointError(f"DISTS weights: unexpected key {key!r}; expected torchvision features.N.*, "
                                  "alpha / beta, or DISTS' stage{k}.N.* keys")
    if tv:
        out.update(torchvision_to_sliced(tv, VGG16_SLICES, "stage", "DISTS VGG16"))
    return out
