"""HVI-CIDNet: "HVI: A New Color Space for Low-light Image Enhancement" (Yan, Feng, Zhang, Xu, Yu, Zhang; CVPR 2025).

Module names and constructor arguments follow the authors' code (as in spandrel 0.4.2, class ``HVICIDNet`` there,
``CIDNet`` in the authors' code), so released checkpoints load with ``strict=True`` and give the same output.

The RGB image is mapped to the HVI colour space (hue / saturation on a plane scaled by a learnt intensity-collapse
function, plus the max-intensity channel). Two U-Nets, one on the HV plane and one on intensity, exchange
information through lightweight cross-attention (channel-wise attention, queries from one branch, keys / values
from the other); the enhanced HVI map goes back to RGB. Scale 1, RGB in and out. Three bilinear halvings: inputs
are padded (reflect, then edge) at the bottom / right to a multiple of 8 inside ``forward`` (spandrel's size
requirement) and the output cropped; ``tile_multiple`` is 8.

The colour transforms are written with ``torch.where`` instead of masked assignments (no data-dependent shapes,
no host sync): same values and gradients. The authors' decoder computes ``I_LCA5`` and discards its output; it is
skipped here and its parameters are frozen (``requires_grad=False``: they get no gradient in the original either,
which distributed training would report as unused parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers
from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.resize_util import resize_bilinear
from anysr.registry import ARCH_REGISTRY

SIZE_MULTIPLE = 8
EPS = 1e-8


class RGB_HVI(nn.Module):  # noqa: N801 (the authors' name; it is part of no key, kept for readers of their code)
    """RGB <-> HVI transforms with the learnt ``density_k`` (the reciprocal of the paper's k).

    ``gated`` / ``gated2`` / ``alpha``: the authors' test-time switches (saturation x 1.3, output x ``alpha``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.density_k = nn.Parameter(torch.full([1], 0.2))
        self.gated = False
        self.gated2 = False
        self.alpha = 1.0

    def _collapse(self, intensity: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return ((intensity * (0.5 * math.pi)).sin() + EPS).pow(k)

    def HVIT(self, img: torch.Tensor) -> torch.Tensor:  # noqa: N802 (the authors' method name)
        """RGB (b, 3, h, w) -> HVI (b, 3, h, w)."""
        r, g, b = img[:, 0], img[:, 1], img[:, 2]
        value = img.amax(1)
        low = img.amin(1)
        span = value - low + EPS
        hue = torch.where(r == value, ((g - b) / span) % 6,
                          torch.where(g == value, 2.0 + (b - r) / span, 4.0 + (r - g) / span))
        hue = torch.where(low == value, 0.0, hue) / 6.0
        sat = torch.where(value == 0, 0.0, (value - low) / (value + EPS))
        radius = self._collapse(value, self.density_k) * sat
        angle = 2.0 * math.pi * hue
        return torch.stack([radius * angle.cos(), radius * angle.sin(), value], 1)

    def PHVIT(self, hvi: torch.Tensor) -> torch.Tensor:  # noqa: N802 (the authors' method name)
        """HVI (b, 3, h, w) -> RGB. ``density_k`` enters as a constant (the authors read it as a Python number)."""
        v = hvi[:, 2].clamp(0, 1)
        scale = self._collapse(v, self.density_k.detach()) + EPS
        hh = (hvi[:, 0].clamp(-1, 1) / scale).clamp(-1, 1)
        vv = (hvi[:, 1].clamp(-1, 1) / scale).clamp(-1, 1)
        h = (torch.atan2(vv, hh) / (2 * math.pi)) % 1
        s = torch.sqrt(hh**2 + vv**2)
        if self.gated:
            s = s * 1.3
        s = s.clamp(0, 1)
        sector = torch.floor(h * 6.0)
        f = h * 6.0 - sector
        p = v * (1.0 - s)
        q = v * (1.0 - f * s)
        t = v * (1.0 - (1.0 - f) * s)
        picks = ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))  # (r, g, b) per sector
        channels = []
        for c in range(3):
            out = torch.zeros_like(h)
            for i in reversed(range(6)):
                out = torch.where(sector == i, picks[i][c], out)
            channels.append(out)
        rgb = torch.stack(channels, 1)
        return rgb * self.alpha if self.gated2 else rgb


class CAB(nn.Module):
    """Cross attention over channels: queries from ``x``, keys / values from ``y`` (1x1 + 3x3 depth-wise convs),
    L2-normalised along the pixels, ``softmax(q k^T * temperature) v`` per head."""

    def __init__(self, dim: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.q = nn.Conv2d(dim, dim, 1, bias=bias)
        self.q_dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim, bias=bias)
        self.kv = nn.Conv2d(dim, dim * 2, 1, bias=bias)
        self.kv_dwconv = nn.Conv2d(dim * 2, dim * 2, 3, 1, 1, groups=dim * 2, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q = self.q_dwconv(self.q(x)).reshape(b, self.num_heads, c // self.num_heads, h * w)
        k, v = self.kv_dwconv(self.kv(y)).reshape(b, 2, self.num_heads, c // self.num_heads, h * w).unbind(1)
        q = F.normalize(q, dim=-1) * self.temperature.to(q.dtype)
        out = F.scaled_dot_product_attention(q, F.normalize(k, dim=-1), v, scale=1.0)
        return self.project_out(out.reshape(b, c, h, w))


class IEL(nn.Module):
    """Intensity enhancement layer: 1x1 conv to 2 x hidden, depth-wise 3x3, two tanh-residual depth-wise branches
    multiplied, 1x1 conv back."""

    def __init__(self, dim: int, ffn_expansion_factor: float = 2.66, bias: bool = False) -> None:
        super().__init__()
        hidden = int(dim * ffn_expansion_factor)
        self.project_in = nn.Conv2d(dim, hidden * 2, 1, bias=bias)
        self.dwconv = nn.Conv2d(hidden * 2, hidden * 2, 3, 1, 1, groups=hidden * 2, bias=bias)
        self.dwconv1 = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=bias)
        self.dwconv2 = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=bias)
        self.project_out = nn.Conv2d(hidden, dim, 1, bias=bias)
        self.Tanh = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.dwconv(self.project_in(x)).chunk(2, dim=1)
        return self.project_out((self.Tanh(self.dwconv1(a)) + a) * (self.Tanh(self.dwconv2(b)) + b))


class HV_LCA(nn.Module):  # noqa: N801 (key prefix of the authors' checkpoints comes from the attribute, not this)
    """HV-branch cross attention: ``x + CAB(norm x, norm y)``, then ``IEL(norm .)`` (no second residual)."""

    def __init__(self, dim: int, num_heads: int, bias: bool = False) -> None:
        super().__init__()
        self.gdfn = IEL(dim)
        self.norm = LayerNorm2d(dim)
        self.ffn = CAB(dim, num_heads, bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + self.ffn(self.norm(x), self.norm(y))
        return self.gdfn(self.norm(x))


class I_LCA(HV_LCA):  # noqa: N801
    """Intensity-branch cross attention: as ``HV_LCA`` with a residual around the IEL."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x + self.ffn(self.norm(x), self.norm(y))
        return x + self.gdfn(self.norm(x))


class BilinearResize(nn.Module):
    """Bilinear resize by ``factor`` with ``align_corners=True`` (``nn.UpsamplingBilinear2d``), output size
    ``floor(side * factor)`` (with aligned corners the factor only sets the size). Gathers on XLA
    (``resize_bilinear``); elsewhere ``F.interpolate`` with the factor, which keeps ONNX sizes dynamic."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if resamples_by_gathers(x.device):
            h, w = x.shape[-2:]
            return resize_bilinear(x, (int(h * self.factor), int(w * self.factor)), align_corners=True)
        return F.interpolate(x, scale_factor=self.factor, mode="bilinear", align_corners=True)


class NormDownsample(nn.Module):
    """3x3 conv, bilinear halving, PReLU, optional channel layer norm."""

    def __init__(self, in_ch: int, out_ch: int, scale: float = 0.5, use_norm: bool = False) -> None:
        super().__init__()
        self.use_norm = use_norm
        if use_norm:
            self.norm = LayerNorm2d(out_ch)
        self.prelu = nn.PReLU()
        self.down = nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, 1, 1, bias=False), BilinearResize(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prelu(self.down(x))
        return self.norm(x) if self.use_norm else x


class NormUpsample(nn.Module):
    """3x3 conv, bilinear doubling, concatenation with the skip, 1x1 conv, PReLU, optional channel layer norm."""

    def __init__(self, in_ch: int, out_ch: int, scale: float = 2, use_norm: bool = False) -> None:
        super().__init__()
        self.use_norm = use_norm
        if use_norm:
            self.norm = LayerNorm2d(out_ch)
        self.prelu = nn.PReLU()
        self.up_scale = nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, 1, 1, bias=False), BilinearResize(scale))
        self.up = nn.Conv2d(out_ch * 2, out_ch, 1, bias=False)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.prelu(self.up(torch.cat([self.up_scale(x), skip], 1)))
        return self.norm(x) if self.use_norm else x


def _edge_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    """3x3 conv after one pixel of edge (replicate) padding."""
    return nn.Sequential(nn.ReplicationPad2d(1), nn.Conv2d(in_ch, out_ch, 3, bias=False))


@ARCH_REGISTRY.register()
class HVICIDNet(nn.Module):
    """HVI-CIDNet (x1, RGB in and out).

    Args:
        channels: widths (ch1, ch2, ch3, ch4) of the full-resolution stem and the three halvings
            ([36, 36, 72, 144] in the released models).
        heads: attention heads; the first entry is unused (no attention at full resolution).
        norm: channel layer norm after each down / up sampling block.
    """

    tile_multiple: int = SIZE_MULTIPLE
    other_names = ("CIDNet", "HVI-CIDNet")

    def __init__(self, *, channels: Sequence[int] = (36, 36, 72, 144), heads: Sequence[int] = (1, 2, 4, 8),
                 norm: bool = False) -> None:
        super().__init__()
        if len(channels) != 4 or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in channels):
            raise ArchArgumentError("channels", f"HVICIDNet needs 4 positive channel counts, got {channels!r}")
        if len(heads) != 4 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in heads):
            raise ArchArgumentError("heads", f"HVICIDNet needs 4 positive head counts, got {heads!r}")
        for c, n in zip(channels[1:], heads[1:]):
            if c % n:
                raise ArchArgumentError("heads", f"HVICIDNet: {c} channels cannot be split into {n} heads")
        ch1, ch2, ch3, ch4 = channels
        _, h2, h3, h4 = heads
        self.HVE_block0 = _edge_conv(3, ch1)
        self.HVE_block1 = NormDownsample(ch1, ch2, use_norm=norm)
        self.HVE_block2 = NormDownsample(ch2, ch3, use_norm=norm)
        self.HVE_block3 = NormDownsample(ch3, ch4, use_norm=norm)
        self.HVD_block3 = NormUpsample(ch4, ch3, use_norm=norm)
        self.HVD_block2 = NormUpsample(ch3, ch2, use_norm=norm)
        self.HVD_block1 = NormUpsample(ch2, ch1, use_norm=norm)
        self.HVD_block0 = _edge_conv(ch1, 2)
        self.IE_block0 = _edge_conv(1, ch1)
        self.IE_block1 = NormDownsample(ch1, ch2, use_norm=norm)
        self.IE_block2 = NormDownsample(ch2, ch3, use_norm=norm)
        self.IE_block3 = NormDownsample(ch3, ch4, use_norm=norm)
        self.ID_block3 = NormUpsample(ch4, ch3, use_norm=norm)
        self.ID_block2 = NormUpsample(ch3, ch2, use_norm=norm)
        self.ID_block1 = NormUpsample(ch2, ch1, use_norm=norm)
        self.ID_block0 = _edge_conv(ch1, 1)
        for i, (c, n) in enumerate(((ch2, h2), (ch3, h3), (ch4, h4), (ch4, h4), (ch3, h3), (ch2, h2)), 1):
            setattr(self, f"HV_LCA{i}", HV_LCA(c, n))
            setattr(self, f"I_LCA{i}", I_LCA(c, n))
        self.I_LCA5.requires_grad_(False)
        self.in_channels = 3  # its output is discarded by the authors' decoder
        self.trans = RGB_HVI()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, SIZE_MULTIPLE)
        hvi = self.trans.HVIT(x)
        i0 = self.IE_block0(hvi[:, 2:3])
        hv0 = self.HVE_block0(hvi)
        i1, hv1 = self.IE_block1(i0), self.HVE_block1(hv0)
        i_skip1, hv_skip1 = self.I_LCA1(i1, hv1), self.HV_LCA1(hv1, i1)
        i2, hv2 = self.IE_block2(i_skip1), self.HVE_block2(hv_skip1)
        # the level-2 attention outputs only feed the skips: level 3 is computed from i2 / hv2 (authors' wiring)
        i_skip2, hv_skip2 = self.I_LCA2(i2, hv2), self.HV_LCA2(hv2, i2)
        i3, hv3 = self.IE_block3(i2), self.HVE_block3(hv2)
        i4, hv4 = self.I_LCA3(i3, hv3), self.HV_LCA3(hv3, i3)
        i_dec, hv_dec = self.I_LCA4(i4, hv4), self.HV_LCA4(hv4, i4)
        hv_dec = self.HVD_block3(hv_dec, hv_skip2)
        i_dec = self.ID_block3(i_dec, i_skip2)
        hv_dec = self.HVD_block2(self.HV_LCA5(hv_dec, i_dec), hv_skip1)
        i_dec = self.ID_block2(i_dec, i_skip1)  # I_LCA5 would act here; its output is unused (see module doc)
        i_dec, hv_dec = self.I_LCA6(i_dec, hv_dec), self.HV_LCA6(hv_dec, i_dec)
        i_out = self.ID_block0(self.ID_block1(i_dec, i0))
        hv_out = self.HVD_block0(self.HVD_block1(hv_dec, hv0))
        rgb = self.trans.PHVIT(torch.cat([hv_out, i_out], 1) + hvi)
        return rgb[..., :h, :w]

    def HVIT(self, x: torch.Tensor) -> torch.Tensor:  # noqa: N802 (the authors' method name)
        """The HVI map of an RGB image (used by the authors' HVI-space losses)."""
        return self.trans.HVIT(x)


__all__ = ["CAB", "HVICIDNet", "RGB_HVI"]


def _recognise(s: StateShapes) -> dict:
    """HVI-CIDNet from its tensors: the four widths from the stem and the three downsamplers, the heads of the
    three attention levels from their temperatures (the first entry is unused: 1 kept), the norm switch."""
    channels = [s.dim("HVE_block0.1.weight", 0)] + [s.dim(f"HVE_block{i}.down.0.weight", 0) for i in (1, 2, 3)]
    heads = [1] + [s.dim(f"HV_LCA{i}.ffn.temperature", 0) for i in (1, 2, 3)]
    return {"channels": channels, "heads": heads, "norm": "HVE_block1.norm.weight" in s}


register_recogniser("HVICIDNet", _recognise)
