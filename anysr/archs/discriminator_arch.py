"""Discriminators for GAN training (SRGAN / ESRGAN / Real-ESRGAN), with BasicSR's state-dict keys."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm

from anysr.archs.arch_util import ArchArgumentError
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


@ARCH_REGISTRY.register()
class VGGStyleDiscriminator(nn.Module):
    """VGG-like classifier of ``input_size`` x ``input_size`` patches: one logit per image.

    Five (six for 256) stages of conv3x3 + strided conv4x4, batch norm and leaky ReLU, then two linear
    layers. 128 and 256 give BasicSR's layout; any other multiple of 32 (e.g. 32 for tests) keeps the five
    stages and sizes ``linear1`` to the remaining ``(input_size / 32)^2`` positions.

    Args:
        num_in_ch: image channels. num_feat: channels of the first stage (doubling up to 8x).
        input_size: height and width of the patches it judges.
    """

    def __init__(self, num_in_ch: int, num_feat: int, input_size: int = 128) -> None:
        super().__init__()
        if not isinstance(input_size, int) or input_size < 32 or input_size % 32:
            raise ArchArgumentError("input_size", f"must be a multiple of 32 (BasicSR: 128 or 256), got {input_size!r}")
        self.input_size = input_size
        stages = 6 if input_size == 256 else 5
        widths = [num_feat, num_feat * 2, num_feat * 4, num_feat * 8, num_feat * 8, num_feat * 8]
        self.conv0_0 = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1, bias=True)
        self.conv0_1 = nn.Conv2d(num_feat, num_feat, 4, 2, 1, bias=False)
        self.bn0_1 = nn.BatchNorm2d(num_feat, affine=True)
        for i in range(1, stages):
            c_in, c_out = widths[i - 1], widths[i]
            setattr(self, f"conv{i}_0", nn.Conv2d(c_in, c_out, 3, 1, 1, bias=False))
            setattr(self, f"bn{i}_0", nn.BatchNorm2d(c_out, affine=True))
            setattr(self, f"conv{i}_1", nn.Conv2d(c_out, c_out, 4, 2, 1, bias=False))
            setattr(self, f"bn{i}_1", nn.BatchNorm2d(c_out, affine=True))
        self.stages = stages
        side = input_size // 2**stages
        self.linear1 = nn.Linear(num_feat * 8 * side * side, 100)
        self.linear2 = nn.Linear(100, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] != self.input_size or x.shape[3] != self.input_size:
            raise ValueError(f"VGGStyleDiscriminator(input_size={self.input_size}) got a {tuple(x.shape)} batch; "
                             "crop to input_size (datasets.train.gt_size)")
        feat = self.lrelu(self.conv0_0(x))
        feat = self.lrelu(self.bn0_1(self.conv0_1(feat)))
        for i in range(1, self.stages):
            feat = self.lrelu(getattr(self, f"bn{i}_0")(getattr(self, f"conv{i}_0")(feat)))
            feat = self.lrelu(getattr(self, f"bn{i}_1")(getattr(self, f"conv{i}_1")(feat)))
        feat = self.lrelu(self.linear1(feat.flatten(1)))
        return self.linear2(feat)


def _up2(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Twice the size along ``dim``: output ``2i`` is ``0.75 t[i] + 0.25 t[i-1]``, ``2i+1`` is
    ``0.75 t[i] + 0.25 t[i+1]`` (the border repeated): bilinear interpolation with ``align_corners=False``."""
    n = t.shape[dim]
    prev = torch.cat([t.narrow(dim, 0, 1), t.narrow(dim, 0, n - 1)], dim)
    nxt = torch.cat([t.narrow(dim, 1, n - 1), t.narrow(dim, n - 1, 1)], dim)
    even, odd = 0.75 * t + 0.25 * prev, 0.75 * t + 0.25 * nxt
    shape = list(t.shape)
    shape[dim] = 2 * n
    return torch.stack([even, odd], dim + 1).reshape(shape)


def upsample2x(t: torch.Tensor) -> torch.Tensor:
    """``F.interpolate(t, scale_factor=2, mode='bilinear', align_corners=False)`` of an NCHW batch (equal to float
    rounding) from slicing and arithmetic only: XLA lowers it, forward and backward (the XLA 2.9 backend runs
    ``upsample_bilinear2d_backward`` on the CPU, one host round trip per use)."""
    return _up2(_up2(t, 2), 3)


@ARCH_REGISTRY.register()
class UNetDiscriminatorSN(nn.Module):
    """U-Net discriminator with spectral normalisation (Real-ESRGAN): one logit per pixel.

    Three strided downsampling convs, three bilinear-upsampling convs (with optional skip additions) and
    two refinement convs; every inner conv is wrapped by ``torch.nn.utils.spectral_norm`` so the state
    dict holds ``weight_orig`` / ``weight_u`` / ``weight_v`` as BasicSR's does. Height and width must be
    divisible by 8.

    Args:
        num_in_ch: image channels. num_feat: base channels. skip_connection: add encoder features to the decoder.
    """

    def __init__(self, num_in_ch: int, num_feat: int = 64, skip_connection: bool = True) -> None:
        super().__init__()
        self.skip_connection = skip_connection
        f = num_feat
        self.conv0 = nn.Conv2d(num_in_ch, f, 3, 1, 1)
        self.conv1 = spectral_norm(nn.Conv2d(f, f * 2, 4, 2, 1, bias=False))
        self.conv2 = spectral_norm(nn.Conv2d(f * 2, f * 4, 4, 2, 1, bias=False))
        self.conv3 = spectral_norm(nn.Conv2d(f * 4, f * 8, 4, 2, 1, bias=False))
        self.conv4 = spectral_norm(nn.Conv2d(f * 8, f * 4, 3, 1, 1, bias=False))
        self.conv5 = spectral_norm(nn.Conv2d(f * 4, f * 2, 3, 1, 1, bias=False))
        self.conv6 = spectral_norm(nn.Conv2d(f * 2, f, 3, 1, 1, bias=False))
        self.conv7 = spectral_norm(nn.Conv2d(f, f, 3, 1, 1, bias=False))
        self.conv8 = spectral_norm(nn.Conv2d(f, f, 3, 1, 1, bias=False))
        self.conv9 = nn.Conv2d(f, 1, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def act(t: torch.Tensor) -> torch.Tensor:
            return F.leaky_relu(t, negative_slope=0.2)

        x0 = act(self.conv0(x))
        x1 = act(self.conv1(x0))
        x2 = act(self.conv2(x1))
        x3 = act(self.conv3(x2))
        x4 = act(self.conv4(upsample2x(x3)))
        if self.skip_connection:
            x4 = x4 + x2
        x5 = act(self.conv5(upsample2x(x4)))
        if self.skip_connection:
            x5 = x5 + x1
        x6 = act(self.conv6(upsample2x(x5)))
        if self.skip_connection:
            x6 = x6 + x0
        out = act(self.conv8(act(self.conv7(x6))))
        return self.conv9(out)


# neosr's name for Real-ESRGAN's discriminator (tests/test_neosr_names.py checks it against the one neosr builds)
register_presets("UNetDiscriminatorSN", scale_arg=None, source="neosr", presets={
    "unet": {"num_in_ch": 3},  # 4.38 M parameters
})
