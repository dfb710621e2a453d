"""SPyNet: optical flow from a spatial pyramid of small CNNs (Ranjan and Black, 2017), as used by BasicVSR,
IconVSR and BasicVSR++.

Parameter names follow BasicSR 1.4.2 (``basic_module.<level>.basic_module.<i>``, buffers ``mean`` / ``std``),
so its weights load with ``strict=True`` and give its flow. Two differences, both outside what BasicSR can run:
inputs of 32 pixels or less in a dimension work (BasicSR starts its coarsest level from an empty tensor and
fails), and the architecture never reads a weights file (``load_path`` must be None).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import flow_warp, refuse_weights_path
from anysr.registry import ARCH_REGISTRY

PYRAMID_LEVELS = 6
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SpyNetBasicModule(nn.Module):
    """One pyramid level: five 7x7 convs (8 -> 32 -> 64 -> 32 -> 16 -> 2 channels) with ReLUs between.

    Input channels: reference image (3), warped supporting image (3), current flow estimate (2).
    """

    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        chans = (8, 32, 64, 32, 16, 2)
        layers: list[nn.Module] = []
        for i in range(5):
            last = i == 4
            layers.append(nn.Conv2d(chans[i], chans[i + 1], 7, 1, 3, bias=last or not batch_norm))
            if not last:
                if batch_norm:
                    layers.append(nn.BatchNorm2d(chans[i + 1]))
                layers.append(nn.ReLU(inplace=batch_norm))
        self.basic_module = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.basic_module(x)


def upsample_flow(flow: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Double a flow field's resolution (and magnitude); an odd target size repeats the last row / column."""
    up = F.interpolate(flow, scale_factor=2, mode="bilinear", align_corners=True) * 2.0
    pad_h, pad_w = size[0] - up.shape[-2], size[1] - up.shape[-1]
    if pad_h or pad_w:
        up = F.pad(up, [0, pad_w, 0, pad_h], mode="replicate")
    return up


def pyramid(x: torch.Tensor, levels: int) -> list[torch.Tensor]:
    """``levels`` images from coarsest to ``x``, each half the size of the next (2x2 average pooling)."""
    out = [x]
    for _ in range(levels - 1):
        out.insert(0, F.avg_pool2d(out[0], kernel_size=2, stride=2, count_include_pad=False))
    return out


@ARCH_REGISTRY.register()
class SpyNet(nn.Module):
    """Optical flow ``forward(ref, supp)`` -> (b, 2, h, w): for each pixel of ``ref``, the (x, y) displacement
    in pixels where it is found in ``supp`` (so ``flow_warp(supp, flow)`` resembles ``ref``).

    Inputs are RGB in [0, 1], any size: they are resized to a multiple of 32 for the 6-level pyramid and the
    flow is resized back.

    Args:
        load_path: accepted for BasicSR compatibility and must be None: pretrained SpyNet weights are loaded by
            the engine (``path.pretrain_network_g``), never by the architecture.
    """

    # Computed, not read: BasicSR registers them after loading, so its published weights lack them.
    computed_buffers = ("mean", "std")

    def __init__(self, load_path: str | None = None) -> None:
        super().__init__()
        refuse_weights_path("load_path", load_path, "SpyNet")
        self.basic_module = nn.ModuleList(SpyNetBasicModule() for _ in range(PYRAMID_LEVELS))
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """ImageNet normalisation."""
        return (x - self.mean) / self.std

    def process(self, ref: torch.Tensor, supp: torch.Tensor) -> torch.Tensor:
        """Coarse-to-fine flow for inputs whose sides are multiples of 32."""
        refs = pyramid(self.preprocess(ref), PYRAMID_LEVELS)
        supps = pyramid(self.preprocess(supp), PYRAMID_LEVELS)
        b, _, h0, w0 = refs[0].shape
        # The estimate starts at zero: its upsampled version on the coarsest level is zero too.
        flow = refs[0].new_zeros(b, 2, h0, w0)
        for level, (r, s) in enumerate(zip(refs, supps)):
            up = flow if level == 0 else upsample_flow(flow, (r.shape[-2], r.shape[-1]))
            warped = flow_warp(s, up.permute(0, 2, 3, 1), interp_mode="bilinear", padding_mode="border")
            flow = self.basic_module[level](torch.cat([r, warped, up], 1)) + up
        return flow

    def forward(self, ref: torch.Tensor, supp: torch.Tensor) -> torch.Tensor:
        if ref.shape != supp.shape or ref.dim() != 4 or ref.shape[1] != 3:
            raise ValueError(f"SpyNet: ref and supp must be RGB batches of one shape (b, 3, h, w), got "
                             f"{tuple(ref.shape)} and {tuple(supp.shape)}")
        h, w = ref.shape[-2:]
        h32, w32 = math.ceil(h / 32) * 32, math.ceil(w / 32) * 32
        ref = F.interpolate(ref, size=(h32, w32), mode="bilinear", align_corners=False)
        supp = F.interpolate(supp, size=(h32, w32), mode="bilinear", align_corners=False)
        flow = F.interpolate(self.process(ref, supp), size=(h, w), mode="bilinear", align_corners=False)
        # Displacements were measured on the resized grid: scale x and y back.
        return torch.cat([flow[:, :1] * (w / w32), flow[:, 1:] * (h / h32)], dim=1)


__all__ = ["SpyNet", "SpyNetBasicModule", "pyramid", "upsample_flow"]
