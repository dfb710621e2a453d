"""MSDAN: a lightweight SR network of blueprint-separable convs and multi-scale spatial attention, as neosr trains it.

Module names and constructor arguments follow neosr's ``msdan`` (``msdan_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. Blueprint-separable convs (BSConvU: 1x1 without bias, then depth-wise)
throughout: one in, ``num_DFEB`` blocks with a long skip, a sub-pixel upsampler (x2: BSConv, PixelShuffle(2),
BSConv from a quarter of the channels, GELU; x4: that twice, with the same weights; x3: BSConv to 54 channels,
PixelShuffle(3), BSConv from 6, GELU), one BSConv out to RGB, plus the bicubic upscaled input.

A block (DFEB): an EBFB (three gated steps ``y = c(y) + sigmoid(c(y)) * gelu(bsconv_k(y))``, k = 3, 5, 7, with one
shared 1x1 conv ``c``, fused by a 1x1 conv) and EMSSA (multi-scale spatial attention on a quarter of the channels:
adaptive max pools to 1/2, 1/4 and 1/8 of the size, BSConvs, nearest upsampling back, a sigmoid gate), plus a
shortcut.

The upsampler holds the layers of every scale (neosr's files have them all); those the scale does not use do not
train here (neosr's optimiser leaves them as they are too). On XLA devices and in ONNX export the adaptive pools
and the nearest upsampling (to sizes that need not be multiples) are gathers over index tensors computed from the
sizes (the same values; XLA lowers their backward, ONNX keeps the sizes symbolic), and the bicubic upscaling is
gathers everywhere (PyTorch's bicubic: a = -0.75, edge pixels repeated, positions and weights in float32, equal to
its kernel's within a few ulps). The pools need 8 pixels per side: smaller inputs are grown to 8 (reflect / edge
padding) for the network and its output cropped back.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers
from anysr.archs.arch_util import ArchArgumentError, pad_to_min_size
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.resize_util import adaptive_max_gather
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

MIN_SIZE = 8  # EMSSA pools to 1/8 of the size
MID_X3 = 54  # the x3 upsampler's width before its PixelShuffle(3)
CUBIC_A = -0.75  # PyTorch's bicubic


# ----------------------------------------------------------------------------- resampling

def _by_gathers(x: torch.Tensor) -> bool:
    return resamples_by_gathers(x.device) or torch.onnx.is_in_onnx_export()


def adaptive_max_pool(x: torch.Tensor, factor: int) -> torch.Tensor:
    """``F.adaptive_max_pool2d(x, (h // factor, w // factor))`` (gathers on XLA and in ONNX export)."""
    h, w = x.shape[-2:]
    if not _by_gathers(x):
        return F.adaptive_max_pool2d(x, (h // factor, w // factor))
    taps = 2 * factor + 1  # the widest cell of a pool to n // factor cells, plus one
    return adaptive_max_gather(adaptive_max_gather(x, 2, h // factor, taps), 3, w // factor, taps)


def _nearest_1d(x: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    n = x.shape[dim]
    src = (torch.arange(out, device=x.device, dtype=torch.float32) * (n / out)).floor().long()
    return x.index_select(dim, src.clamp(max=n - 1))


def nearest_resize(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``F.interpolate(x, size, mode="nearest")`` (gathers on XLA and in ONNX export)."""
    if not _by_gathers(x):
        return F.interpolate(x, size=size, mode="nearest")
    return _nearest_1d(_nearest_1d(x, 2, size[0]), 3, size[1])


def _cubic_weights(t: torch.Tensor) -> list[torch.Tensor]:
    """PyTorch's four cubic-convolution weights (a = -0.75) at fractional offset ``t``, in ``t``'s dtype."""
    a = CUBIC_A

    def near(d: torch.Tensor) -> torch.Tensor:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: torch.Tensor) -> torch.Tensor:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    rest = 1 - t
    return [far(t + 1), near(t), near(rest), far(rest + 1)]


def _bicubic_1d(x: torch.Tensor, dim: int, scale: int) -> torch.Tensor:
    n = x.shape[dim]
    # source positions in float32 as PyTorch's kernel computes them (1 / scale rounded to float32 first)
    step = torch.tensor(1.0 / scale, dtype=torch.float32, device=x.device)
    src = (torch.arange(n * scale, device=x.device, dtype=torch.float32) + 0.5) * step - 0.5
    base = src.floor()
    weights = _cubic_weights(src - base)
    base = base.long()
    shape = [1] * x.dim()
    shape[dim] = -1
    out = None
    for k, wk in enumerate(weights):
        tap = x.index_select(dim, (base + (k - 1)).clamp(0, n - 1)) * wk.to(x.dtype).view(shape)
        out = tap if out is None else out + tap
    return out


def bicubic_upscale(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=scale, mode="bicubic")`` for an integer ``scale`` as four gathers per axis
    (columns, then rows; edge pixels repeated) weighted as PyTorch weighs them: ops that XLA lowers (the op itself
    has no XLA lowering) and ONNX exports with symbolic sizes."""
    return _bicubic_1d(_bicubic_1d(x, 3, scale), 2, scale)


# ----------------------------------------------------------------------------- layers

class BSConvU(nn.Sequential):
    """Blueprint-separable conv: ``pw`` (1x1, no bias), then ``dw`` (depth-wise ``k x k``)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int) -> None:
        super().__init__()
        self.pw = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.dw = nn.Conv2d(c_out, c_out, kernel_size, padding=kernel_size // 2, groups=c_out)


class EMSSA(nn.Module):
    """Multi-scale spatial attention: ``x0 * sigmoid(c(c([s0, s1, s2, s3]) + up(r))))`` on ``r = down(x0)``, with
    ``s0 = mid(r)`` and ``s_i`` the BSConv (7, 5, 3) of ``r`` max-pooled to 1/2, 1/4, 1/8, upsampled back."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        q = channels // 4
        self.BSConv3 = BSConvU(q, q, 3)
        self.BSConv5 = BSConvU(q, q, 5)
        self.BSConv7 = BSConvU(q, q, 7)
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.conv1_mid = nn.Conv2d(q, q, 1)
        self.conv1_down = nn.Conv2d(channels, q, 1)
        self.conv1_up = nn.Conv2d(q, channels, 1)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        size = (x0.shape[-2], x0.shape[-1])
        r = self.conv1_down(x0)
        parts = [self.conv1_mid(r)]
        for factor, conv in ((2, self.BSConv7), (4, self.BSConv5), (8, self.BSConv3)):
            parts.append(nearest_resize(conv(adaptive_max_pool(r, factor)), size))
        out = self.conv1(torch.cat(parts, dim=1)) + self.conv1_up(r)
        return x0 * torch.sigmoid(self.conv1(out))


class EBFB(nn.Module):
    """Three gated steps ``y = c(y) + sigmoid(c(y)) * gelu(bsconv_k(y))`` (k = 3, 5, 7; one 1x1 ``c``); the
    first step's ``c(x)``, every step's ``c(y)`` and the last gate fused by a 1x1 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.BSConv3 = BSConvU(channels, channels, 3)
        self.BSConv5 = BSConvU(channels, channels, 5)
        self.BSConv7 = BSConvU(channels, channels, 7)
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.conv1_down = nn.Conv2d(4 * channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = []
        y = x
        for conv in (self.BSConv3, self.BSConv5, self.BSConv7):
            c = self.conv1(y)
            taps.append(c)
            gated = torch.sigmoid(c) * F.gelu(conv(y))
            y = c + gated
        taps.append(gated)
        return self.conv1_down(torch.cat(taps, dim=1))


class DFEB(nn.Module):
    """``x + EMSSA(EBFB(x))``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.EBFB = EBFB(channels)
        self.EMSSA = EMSSA(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.EMSSA(self.EBFB(x))


class Upsampler(nn.Module):
    """x2: ``gelu(bs1_2(shuffle2(bs_2(x))))``, x4: that twice, x3: ``gelu(bs1_3(shuffle3(bs_3(x))))``."""

    def __init__(self, channels: int, upscale_factor: int) -> None:
        super().__init__()
        self.BSConv_2 = BSConvU(channels, channels, 3)
        self.BSConv1_2 = BSConvU(channels // 4, channels, 3)
        self.BSConv_3 = BSConvU(channels, MID_X3, 3)
        self.BSConv1_3 = BSConvU(MID_X3 // 9, channels, 3)
        self.upscale_factor = upscale_factor
        unused = (self.BSConv_2, self.BSConv1_2) if upscale_factor == 3 else (self.BSConv_3, self.BSConv1_3)
        for m in unused:
            m.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upscale_factor == 3:
            return F.gelu(self.BSConv1_3(F.pixel_shuffle(self.BSConv_3(x), 3)))
        for _ in range(self.upscale_factor // 2):
            x = F.gelu(self.BSConv1_2(F.pixel_shuffle(self.BSConv_2(x), 2)))
        return x


@ARCH_REGISTRY.register()
class MSDAN(nn.Module):
    """MSDAN (neosr's ``msdan``); the defaults are the published network. RGB in and out.

    Args (neosr's): channels (width, a multiple of 4), num_DFEB (blocks), upscale_factor (2, 3 or 4).
    """

    def __init__(self, channels: int = 48, num_DFEB: int = 8, upscale_factor: int = 4) -> None:  # noqa: N803
        super().__init__()
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 4 or channels % 4:
            raise ArchArgumentError("channels", f"MSDAN needs channels a positive multiple of 4, got {channels!r}")
        if isinstance(num_DFEB, bool) or not isinstance(num_DFEB, int) or num_DFEB < 0:
            raise ArchArgumentError("num_DFEB", f"MSDAN needs an integer num_DFEB >= 0, got {num_DFEB!r}")
        if isinstance(upscale_factor, bool) or upscale_factor not in (2, 3, 4):
            raise ArchArgumentError("upscale_factor", f"MSDAN's upsampler is x2, x3 or x4, got {upscale_factor!r}")
        self.upscale_factor = upscale_factor
        self.in_channels = 3
        self.layers = nn.Sequential(*(DFEB(channels) for _ in range(num_DFEB)))
        self.BSConv_first = BSConvU(3, channels, 3)
        self.upsampler = Upsampler(channels, upscale_factor)
        self.BSConv_last = BSConvU(channels, 3, 3)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        h, w = x0.shape[-2:]
        s = self.upscale_factor
        x1 = self.BSConv_first(pad_to_min_size(x0, MIN_SIZE))
        y = self.BSConv_last(self.upsampler(self.layers(x1) + x1))
        return bicubic_upscale(x0, s) + y[..., : h * s, : w * s]


__all__ = ["MSDAN", "adaptive_max_pool", "bicubic_upscale", "nearest_resize"]


def _recognise(s: StateShapes) -> list[dict] | None:
    """MSDAN from its tensors: width from the first BSConv, the blocks, the upsampler's four BSConvs (all in every
    file: the scale is in no tensor, so it is not read: the class's x4 unless the options say otherwise)."""
    if s.shape("BSConv_first.pw.weight")[1:] != (3, 1, 1) or s.dim("upsampler.BSConv_3.pw.weight", 0) != MID_X3:
        return None
    return {"channels": s.dim("BSConv_first.pw.weight", 0), "num_DFEB": s.count("layers.")}


register_recogniser("MSDAN", _recognise)
# neosr's name: the class defaults (neosr's), the option file's top-level scale
register_presets("MSDAN", scale_arg="upscale_factor", source="neosr", presets={"msdan": {}})
