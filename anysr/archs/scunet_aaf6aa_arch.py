"""SCUNet_aaf6aa: aaf6aa's super-resolution variant of SCUNet (github.com/aaf6aa/SCUNet; traiNNer-redux's
``SCUNet_aaf6aa``).

Module names and constructor arguments follow traiNNer-redux's ``SCUNet_aaf6aa``, so its checkpoints load with
``strict=True`` and give the same output. The swin-conv U-Net is SCUNet's (``scunet_arch.py``: the same window
attention, blocks and names), with these changes:

* each swin-conv block adds Gaussian noise (sigma 0.05, training only; the gradient passes unchanged);
* ``residual``: a 3x3 conv (``m_res``) on the head's features before the long shortcut;
* ``scale`` > 1 (a power of two): the U-Net's ups are nearest x2 + conv + LeakyReLU + conv + LeakyReLU
  (``Upconv``) instead of transposed convs, and before the tail two RRDBs and nearest x2 + conv + LeakyReLU steps
  (``m_upsample``) upscale the features; ``out_nc`` output channels;
* the input is padded on all sides (reflect, centred) to a multiple of 64, and in eval mode by 64 more in each
  direction, then the output cropped (a side too short to reflect continues with edge replication, where the
  reference fails).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, NearestUpsample, drop_path_rates
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.archs.rrdbnet_arch import RRDB
from anysr.archs.scunet_arch import HEAD_DIM, WINDOW_SIZE, ConvTransBlock
from anysr.registry import ARCH_REGISTRY


class NoisyConvTransBlock(ConvTransBlock):
    """SCUNet's swin-conv block with ``sigma``-scaled Gaussian noise added to its output in training."""

    def __init__(self, conv_dim: int, trans_dim: int, drop_path: float, type: str,  # noqa: A002
                 input_resolution: int, sigma: float = 0.05) -> None:
        super().__init__(conv_dim, trans_dim, HEAD_DIM, WINDOW_SIZE, drop_path, type, input_resolution)
        self.sigma = sigma

    def forward(self, x: Tensor) -> Tensor:
        x = super().forward(x)
        if self.training and self.sigma:
            x = x + torch.randn_like(x) * self.sigma
        return x


class Upconv(nn.Module):
    """Nearest x2, 3x3 conv, LeakyReLU(0.2), 3x3 conv to ``out_dim``, LeakyReLU(0.2)."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.up = nn.Sequential(NearestUpsample(2), nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2),
                                nn.Conv2d(dim, out_dim, 3, 1, 1), nn.LeakyReLU(0.2))

    def forward(self, x: Tensor) -> Tensor:
        return self.up(x)


class RRDBUpsample(nn.Module):
    """Two RRDBs, then per factor of two nearest x2 + conv + LeakyReLU, then conv + LeakyReLU."""

    def __init__(self, dim: int, nb: int = 2, scale: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = [RRDB(dim, 32) for _ in range(nb)]
        for _ in range(int(math.log2(scale))):
            layers += [NearestUpsample(2), nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2)]
        self.up = nn.Sequential(*layers, nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2))

    def forward(self, x: Tensor) -> Tensor:
        return self.up(x)


def _pad_centred(x: Tensor, top: int, bottom: int, left: int, right: int) -> Tensor:
    """Reflect padding as far as it goes (side - 1 pixels), then edge replication."""
    h, w = x.shape[-2:]
    ref = (min(left, w - 1), min(right, w - 1), min(top, h - 1), min(bottom, h - 1))
    if any(ref):
        x = F.pad(x, ref, mode="reflect")
    rest = (left - ref[0], right - ref[1], top - ref[2], bottom - ref[3])
    return F.pad(x, rest, mode="replicate") if any(rest) else x


@ARCH_REGISTRY.register()
class SCUNet_aaf6aa(nn.Module):  # noqa: N801 - traiNNer-redux's name
    """SCUNet_aaf6aa.

    Args: in_nc / out_nc: image channels. config: swin-conv blocks per stage (down1, down2, down3, body, up3, up2,
    up1; an eighth entry, as the reference's loader writes it, only counts in the drop-path schedule). dim: width
    of the first stage (a multiple of 64). drop_path_rate: stochastic depth rising to this. input_resolution:
    training patch size (stages whose map is not larger than the window use plain windows). scale: 1 or a power
    of two. residual: the ``m_res`` conv.
    """

    def __init__(self, in_nc: int = 3, out_nc: int = 3, config: Sequence[int] | None = None, dim: int = 64,
                 drop_path_rate: float = 0.0, input_resolution: int = 256, scale: int = 1,
                 residual: bool = True) -> None:
        super().__init__()
        config = [2] * 7 if config is None else list(config)
        if len(config) not in (7, 8) or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in config):
            raise ArchArgumentError("config", f"SCUNet_aaf6aa needs 7 block counts >= 0 (down1, down2, down3, body, "
                                    f"up3, up2, up1), got {config!r}")
        if not isinstance(dim, int) or dim < 2 * HEAD_DIM or dim % (2 * HEAD_DIM):
            raise ArchArgumentError("dim", f"SCUNet_aaf6aa needs dim to be a multiple of {2 * HEAD_DIM}, got {dim!r}")
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1 or scale & (scale - 1):
            raise ArchArgumentError("scale", f"SCUNet_aaf6aa supports scale 1 and powers of two, got {scale!r}")
        self.config = config
        self.dim = dim
        self.scale = scale
        self.residual = residual
        self.tile_multiple: int = 8 * WINDOW_SIZE
        rates = drop_path_rates(drop_path_rate, sum(config))
        starts = [sum(config[:i]) for i in range(7)]

        def stage(i: int, channels: int, resolution: int) -> list[nn.Module]:
            half = channels // 2
            return [NoisyConvTransBlock(half, half, rates[starts[i] + j], "W" if j % 2 == 0 else "SW", resolution)
                    for j in range(config[i])]

        def down(cin: int) -> nn.Module:
            return nn.Conv2d(cin, 2 * cin, 2, 2, 0, bias=False)

        def up(cin: int) -> nn.Module:
            return Upconv(cin, cin // 2) if scale > 1 else nn.ConvTranspose2d(cin, cin // 2, 2, 2, 0, bias=False)

        r = input_resolution
        self.m_head = nn.Sequential(nn.Conv2d(in_nc, dim, 3, 1, 1, bias=False))
        self.m_down1 = nn.Sequential(*stage(0, dim, r), down(dim))
        self.m_down2 = nn.Sequential(*stage(1, 2 * dim, r // 2), down(2 * dim))
        self.m_down3 = nn.Sequential(*stage(2, 4 * dim, r // 4), down(4 * dim))
        self.m_body = nn.Sequential(*stage(3, 8 * dim, r // 8))
        self.m_up3 = nn.Sequential(up(8 * dim), *stage(4, 4 * dim, r // 4))
        self.m_up2 = nn.Sequential(up(4 * dim), *stage(5, 2 * dim, r // 2))
        self.m_up1 = nn.Sequential(up(2 * dim), *stage(6, dim, r))
        if residual:
            self.m_res = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, bias=False))
        if scale > 1:
            self.m_upsample = nn.Sequential(RRDBUpsample(dim, nb=2, scale=scale))
        self.m_tail = nn.Sequential(nn.Conv2d(dim, out_nc, 3, 1, 1, bias=False))

    def forward(self, x0: Tensor) -> Tensor:
        h, w = x0.shape[-2:]
        m = self.tile_multiple
        pad_h, pad_w = (-h) % m + (0 if self.training else m), (-w) % m + (0 if self.training else m)
        top, left = (pad_h + 1) // 2, (pad_w + 1) // 2
        x0 = _pad_centred(x0, top, pad_h - top, left, pad_w - left)
        x1 = self.m_head(x0)
        x2 = self.m_down1(x1)
        x3 = self.m_down2(x2)
        x4 = self.m_down3(x3)
        x = self.m_body(x4)
        x = self.m_up3(x + x4)
        x = self.m_up2(x + x3)
        x = self.m_up1(x + x2)
        x = x + (self.m_res(x1) if self.residual else x1)
        if self.scale > 1:
            x = self.m_upsample(x)
        x = self.m_tail(x)
        s = self.scale
        return x[..., top * s: (top + h) * s, left * s: (left + w) * s]


__all__ = ["SCUNet_aaf6aa"]


def _recognise(s: StateShapes) -> dict:
    """SCUNet_aaf6aa from its tensors: channels and width from the head / tail convs, the blocks of the seven
    stages from the down / body / up sequences (each down and up stage also holds its resampling layer), the
    scale from ``m_upsample``'s convs after its RRDBs, ``residual`` from ``m_res``. The training patch size does
    not show: 64 above x1, else 256 (the reference loader's guess). A file with neither ``m_res`` nor
    ``m_upsample`` has SCUNet's layout and is left to it."""
    if "m_res.0.weight" not in s and not s.has_prefix("m_upsample."):
        raise NotThisFamily("SCUNet's layout")
    convs = [i for i in s.indices("m_upsample.0.up.") if f"m_upsample.0.up.{i}.weight" in s]
    scale = 2 ** (len(convs) - 1) if convs else 1
    stages = [s.count(f"m_down{i}.") - 1 for i in (1, 2, 3)] + [s.count("m_body.")] \
        + [s.count(f"m_up{i}.") - 1 for i in (3, 2, 1)]
    return {"in_nc": s.dim("m_head.0.weight", 1), "out_nc": s.dim("m_tail.0.weight", 0), "config": stages,
            "dim": s.dim("m_head.0.weight", 0), "scale": scale, "residual": "m_res.0.weight" in s,
            "input_resolution": 64 if scale > 1 else 256}


register_recogniser("SCUNet_aaf6aa", _recognise)
