"""DUF: video super-resolution with dynamic upsampling filters and no explicit motion compensation (Jo et al.,
CVPR 2018), BasicSR's version.

A 3D-conv dense network looks at 7 frames and predicts, for every low-resolution pixel and each of the
``scale**2`` sub-pixel positions, a softmax-normalised 5x5 filter applied to the centre frame, plus a residual.
DUF-16 / 28 / 52 are ``num_layer`` 16 / 28 / 52. Module names follow BasicSR 1.4.2, so its checkpoints load with
``strict=True`` and give its outputs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

NUM_FRAMES = 7
# num_layer -> (dense blocks, growth channels)
LAYER_CONFIGS = {16: (3, 32), 28: (9, 16), 52: (21, 16)}


def _bn_args(adapt_official_weights: bool) -> dict[str, float]:
    """Batch-norm settings: the TensorFlow originals' eps / momentum for converted weights, else PyTorch's."""
    return {"eps": 1e-3, "momentum": 1e-3} if adapt_official_weights else {"eps": 1e-5, "momentum": 0.1}


def _dense_unit(in_ch: int, out_ch: int, temporal_pad: int, bn: dict[str, float]) -> nn.Sequential:
    """BN-ReLU-conv1x1x1-BN-ReLU-conv3x3x3 (``temporal_pad`` 0 shortens the clip by two frames)."""
    return nn.Sequential(
        nn.BatchNorm3d(in_ch, **bn), nn.ReLU(inplace=True),
        nn.Conv3d(in_ch, in_ch, (1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), bias=True),
        nn.BatchNorm3d(in_ch, **bn), nn.ReLU(inplace=True),
        nn.Conv3d(in_ch, out_ch, (3, 3, 3), stride=(1, 1, 1), padding=(temporal_pad, 1, 1), bias=True),
    )


class DenseBlocksTemporalReduce(nn.Module):
    """Three dense units without temporal padding: (b, c, t, h, w) -> (b, c + 3 * num_grow_ch, t - 6, h, w)."""

    def __init__(self, num_feat: int = 64, num_grow_ch: int = 32, adapt_official_weights: bool = False) -> None:
        super().__init__()
        bn = _bn_args(adapt_official_weights)
        self.temporal_reduce1 = _dense_unit(num_feat, num_grow_ch, 0, bn)
        self.temporal_reduce2 = _dense_unit(num_feat + num_grow_ch, num_grow_ch, 0, bn)
        self.temporal_reduce3 = _dense_unit(num_feat + 2 * num_grow_ch, num_grow_ch, 0, bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in (self.temporal_reduce1, self.temporal_reduce2, self.temporal_reduce3):
            # The unit's 3x3x3 conv drops the first and last frame; the shortcut drops them too.
            x = torch.cat((x[:, :, 1:-1], unit(x)), 1)
        return x


class DenseBlocks(nn.Module):
    """``num_block`` dense units, each adding ``num_grow_ch`` channels: (b, c, t, h, w) -> (b, c + n * g, t, h, w)."""

    def __init__(self, num_block: int, num_feat: int = 64, num_grow_ch: int = 16,
                 adapt_official_weights: bool = False) -> None:
        super().__init__()
        bn = _bn_args(adapt_official_weights)
        self.dense_blocks = nn.ModuleList(
            _dense_unit(num_feat + i * num_grow_ch, num_grow_ch, 1, bn) for i in range(num_block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.dense_blocks:
            x = torch.cat((x, block(x)), 1)
        return x


class DynamicUpsamplingFilter(nn.Module):
    """Applies per-pixel filters to a 3-channel image: ``forward(x, filters)`` with x (n, 3, h, w) and filters
    (n, kh * kw, s, h, w) -> (n, 3 * s, h, w), channel ``c * s + j`` being filter j applied to channel c
    (zero padding). No parameters.
    """

    def __init__(self, filter_size: tuple[int, int] = (5, 5)) -> None:
        super().__init__()
        if not isinstance(filter_size, tuple) or len(filter_size) != 2:
            raise ValueError(f"filter_size: expected a (kh, kw) tuple, got {filter_size!r}")
        self.filter_size = filter_size

    def forward(self, x: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
        n, k, s, h, w = filters.shape
        kh, kw = self.filter_size
        c = x.shape[1]
        # Neighbourhoods as channels (c, tap) through a conv with one-hot kernels: lowers on every backend.
        one_hot = torch.eye(k, dtype=x.dtype, device=x.device).view(k, 1, kh, kw).repeat(c, 1, 1, 1)
        patches = F.conv2d(x, one_hot, padding=(kh // 2, kw // 2), groups=c).view(n, c, k, h, w)
        out = torch.matmul(patches.permute(0, 3, 4, 1, 2), filters.permute(0, 3, 4, 1, 2))  # (n, h, w, c, s)
        return out.permute(0, 3, 4, 1, 2).reshape(n, c * s, h, w)


@ARCH_REGISTRY.register()
class DUF(nn.Module):
    """DUF: (b, 7, 3, h, w) frames -> (b, 3, h * scale, w * scale) centre frame.

    Args:
        scale: upsampling factor (any integer >= 1).
        num_layer: 16, 28 or 52 (DUF-16 / 28 / 52).
        adapt_official_weights: batch-norm eps / momentum of weights converted from the TensorFlow release.
    """

    def __init__(self, scale: int = 4, num_layer: int = 52, adapt_official_weights: bool = False) -> None:
        super().__init__()
        if num_layer not in LAYER_CONFIGS:
            raise ArchArgumentError("num_layer", f"DUF has 16, 28 or 52 layers, got {num_layer!r}")
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"must be an integer >= 1, got {scale!r}")
        self.scale = scale
        num_block, num_grow_ch = LAYER_CONFIGS[num_layer]
        bn = _bn_args(adapt_official_weights)
        self.conv3d1 = nn.Conv3d(3, 64, (1, 3, 3), stride=(1, 1, 1), padding=(0, 1, 1), bias=True)
        self.dynamic_filter = DynamicUpsamplingFilter((5, 5))
        self.dense_block1 = DenseBlocks(num_block=num_block, num_feat=64, num_grow_ch=num_grow_ch,
                                        adapt_official_weights=adapt_official_weights)
        self.dense_block2 = DenseBlocksTemporalReduce(64 + num_grow_ch * num_block, num_grow_ch,
                                                      adapt_official_weights=adapt_official_weights)
        channels = 64 + num_grow_ch * num_block + num_grow_ch * 3
        self.bn3d2 = nn.BatchNorm3d(channels, **bn)
        self.conv3d2 = nn.Conv3d(channels, 256, (1, 3, 3), stride=(1, 1, 1), padding=(0, 1, 1), bias=True)
        self.conv3d_r1 = nn.Conv3d(256, 256, (1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), bias=True)
        self.conv3d_r2 = nn.Conv3d(256, 3 * scale**2, (1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), bias=True)
        self.conv3d_f1 = nn.Conv3d(256, 512, (1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), bias=True)
        self.conv3d_f2 = nn.Conv3d(512, 25 * scale**2, (1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0), bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5 or x.shape[1] != NUM_FRAMES or x.shape[2] != 3:
            raise ValueError(f"DUF: expected {NUM_FRAMES} RGB frames (b, {NUM_FRAMES}, 3, h, w), got shape "
                             f"{tuple(x.shape)}")
        b, t, _, h, w = x.shape
        x = x.permute(0, 2, 1, 3, 4)  # (b, c, t, h, w) for the 3D convs
        center = x[:, :, t // 2]
        feat = self.dense_block2(self.dense_block1(self.conv3d1(x)))
        feat = F.relu(self.conv3d2(F.relu(self.bn3d2(feat))))
        res = self.conv3d_r2(F.relu(self.conv3d_r1(feat))).squeeze(2)
        filters = self.conv3d_f2(F.relu(self.conv3d_f1(feat)))
        filters = F.softmax(filters.view(b, 25, self.scale**2, h, w), dim=1)
        return F.pixel_shuffle(self.dynamic_filter(center, filters) + res, self.scale)


__all__ = ["DUF", "DenseBlocks", "DenseBlocksTemporalReduce", "DynamicUpsamplingFilter"]


def _recognise(s: StateShapes) -> list[dict]:
    """DUF from its tensors: the variant (16 / 28 / 52 layers) from the width before the last 3-D conv, the scale
    from the residual head (3 x scale**2 channels). The batch-norm settings of converted TensorFlow weights change
    no tensor (the default is kept)."""
    channels = s.dim("bn3d2.weight", 0)
    scale = round((s.dim("conv3d_r2.weight", 0) // 3) ** 0.5)
    return [{"scale": scale, "num_layer": n} for n, (nb, g) in LAYER_CONFIGS.items() if 64 + g * nb + 3 * g == channels]


register_recogniser("DUF", _recognise)
