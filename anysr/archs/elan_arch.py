"""ELAN: Efficient Long-Range Attention Network for Image Super-Resolution (Zhang et al., ECCV 2022).

A 3x3 head, a body of ELAB blocks and a 3x3 conv + PixelShuffle tail, with a long skip over the body. Each ELAB
alternates a local feature extractor (two shift-convs, i.e. fixed one-pixel shifts of five channel groups then a
1x1 conv, with a ReLU between) and group-wise multi-scale self-attention (GMSA): a 1x1 conv + BatchNorm, split into
three channel groups attended within windows of ``window_sizes[0..2]`` (queries are the keys; no scaling), every
second block on windows shifted by half a window. With ``n_share`` > 0 the following ``n_share`` LFE + GMSA pairs
reuse the first pair's attention maps (only the values are new).

Module names, parameters (the frozen shift masks and mean shifts included) and constructor arguments follow
traiNNer-redux's ``ELAN``, so its checkpoints load with ``strict=True`` and give the same output.

Size requirement: the input is reflect-padded (edge-replicated past what reflection reaches) at the bottom /
right to a multiple of the least common multiple of ``window_sizes`` inside forward; the output is cropped
(``tile_multiple``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class MeanShift(nn.Conv2d):
    """Frozen 1x1 conv adding ``sign * rgb_range * mean`` per RGB channel (kept as parameters: checkpoint keys)."""

    def __init__(self, rgb_range: float, sign: int = -1,
                 rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040)) -> None:
        super().__init__(3, 3, kernel_size=1)
        with torch.no_grad():
            self.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            self.bias.copy_(sign * rgb_range * torch.tensor(rgb_mean))
        self.weight.requires_grad_(False)
        self.bias.requires_grad_(False)


class _ShiftThenMix(nn.Module):
    """Depth-wise 3x3 conv with a frozen one-hot kernel per channel (five groups: from the right, left, below,
    above, centre; the last group takes the remainder), then a 1x1 conv."""

    def __init__(self, inp_channels: int, out_channels: int) -> None:
        super().__init__()
        g = inp_channels // 5
        mask = torch.zeros(inp_channels, 1, 3, 3)
        for i, (r, c) in enumerate([(1, 2), (1, 0), (2, 1), (0, 1)]):
            mask[i * g:(i + 1) * g, 0, r, c] = 1.0
        mask[4 * g:, 0, 1, 1] = 1.0
        self.weight = nn.Parameter(mask, requires_grad=False)
        self.conv1x1 = nn.Conv2d(inp_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = F.conv2d(x, self.weight.to(x.dtype), None, 1, 1, 1, x.shape[1])
        return self.conv1x1(shifted)


class ShiftConv2d(nn.Module):
    """Shift-conv (the "fast-training-speed" form that released ELAN checkpoints use)."""

    def __init__(self, inp_channels: int, out_channels: int) -> None:
        super().__init__()
        self.shift_conv = _ShiftThenMix(inp_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shift_conv(x)


class LFE(nn.Module):
    """Local feature extraction: shift-conv to ``exp_ratio`` x width, ReLU, shift-conv back."""

    def __init__(self, inp_channels: int, out_channels: int, exp_ratio: int = 4) -> None:
        super().__init__()
        self.conv0 = ShiftConv2d(inp_channels, out_channels * exp_ratio)
        self.conv1 = ShiftConv2d(out_channels * exp_ratio, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(F.relu(self.conv0(x)))


def _to_windows(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(b, c, H, W) -> (b, windows, ws * ws, c)."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // ws, ws, w // ws, ws).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // ws) * (w // ws), ws * ws, c)


def _from_windows(x: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    """(b, windows, ws * ws, c) -> (b, c, H, W)."""
    b, _, _, c = x.shape
    x = x.view(b, h // ws, w // ws, ws, ws, c).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(b, c, h, w)


class GMSA(nn.Module):
    """Group-wise multi-scale self-attention. ``calc_attn``: 1x1 conv to query/value pairs for three channel groups,
    each attended within its own window size; otherwise values only, weighted by the attention maps given."""

    def __init__(self, channels: int, shifts: int = 4, window_sizes: Sequence[int] = (4, 8, 12),
                 calc_attn: bool = True, keep_attn: bool = False) -> None:
        super().__init__()
        self.shifts = shifts
        self.window_sizes = list(window_sizes)
        self.calc_attn = calc_attn
        self.keep_attn = keep_attn
        width = channels * 2 if calc_attn else channels
        self.split_chns = [width // 3] * 3
        self.project_inp = nn.Sequential(nn.Conv2d(channels, width, kernel_size=1), nn.BatchNorm2d(width))
        self.project_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x: torch.Tensor, prev_atns: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h, w = x.shape[-2:]
        groups = torch.split(self.project_inp(x), self.split_chns, dim=1)
        outs, atns = [], []
        for i, part in enumerate(groups):
            ws = self.window_sizes[i]
            if self.shifts > 0:  # (-ws) // 2 forward and ws // 2 back, as the original (differs for odd ws)
                part = torch.roll(part, shifts=((-ws) // 2, (-ws) // 2), dims=(2, 3))
            if prev_atns is None:
                half = part.shape[1] // 2
                q, v = _to_windows(part[:, :half], ws), _to_windows(part[:, half:], ws)
                if self.keep_attn:
                    atn = torch.softmax(q @ q.transpose(-2, -1), dim=-1)
                    atns.append(atn)
                    y = atn @ v
                else:
                    y = F.scaled_dot_product_attention(q, q, v, scale=1.0)
            else:
                y = prev_atns[i] @ _to_windows(part, ws)
            y = _from_windows(y, ws, h, w)
            if self.shifts > 0:
                y = torch.roll(y, shifts=(ws // 2, ws // 2), dims=(2, 3))
            outs.append(y)
        return self.project_out(torch.cat(outs, dim=1)), (atns if prev_atns is None else prev_atns)


class ELAB(nn.Module):
    """Efficient long-range attention block: (LFE, GMSA) residual pairs; pairs after the first reuse its maps."""

    def __init__(self, inp_channels: int, out_channels: int, exp_ratio: int = 2, shifts: int = 0,
                 window_sizes: Sequence[int] = (4, 8, 12), shared_depth: int = 1) -> None:
        super().__init__()
        self.shared_depth = shared_depth
        self.modules_lfe = nn.ModuleDict({f"lfe_{i}": LFE(inp_channels, out_channels, exp_ratio)
                                          for i in range(shared_depth + 1)})
        self.modules_gmsa = nn.ModuleDict({
            f"gmsa_{i}": GMSA(inp_channels, shifts, window_sizes, calc_attn=i == 0, keep_attn=shared_depth > 0)
            for i in range(shared_depth + 1)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        atn = None
        for i in range(self.shared_depth + 1):
            x = self.modules_lfe[f"lfe_{i}"](x) + x
            y, atn = self.modules_gmsa[f"gmsa_{i}"](x, atn)
            x = y + x
        return x


@ARCH_REGISTRY.register()
class ELAN(nn.Module):
    """ELAN. ``scale``: integer upscale; ``colors``: image channels; ``norm``: subtract / add back
    ``rgb_range`` x the DIV2K mean (RGB only); ``window_sizes``: the three GMSA window sizes; ``m_elan``: total
    (LFE, GMSA) pairs, in ``m_elan // (1 + n_share)`` blocks; ``c_elan``: width (a multiple of 3);
    ``n_share``: pairs per block reusing the first one's attention; ``r_expand``: LFE expansion."""

    def __init__(self, scale: int = 4, colors: int = 3, rgb_range: int = 255, norm: bool = False,
                 window_sizes: Sequence[int] | None = None, m_elan: int = 36, c_elan: int = 180, n_share: int = 0,
                 r_expand: int = 2) -> None:
        super().__init__()
        window_sizes = [4, 8, 16] if window_sizes is None else list(window_sizes)
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"ELAN needs an integer scale >= 1, got {scale!r}")
        if len(window_sizes) < 3 or any(not isinstance(s, int) or s < 1 for s in window_sizes):
            raise ArchArgumentError("window_sizes", f"ELAN needs three positive window sizes (one per channel "
                                    f"group), got {window_sizes!r}")
        if c_elan < 3 or c_elan % 3:
            raise ArchArgumentError("c_elan", f"ELAN splits c_elan into three groups: it must be a multiple of 3, "
                                    f"got {c_elan}")
        if norm and colors != 3:
            raise ArchArgumentError("norm", f"ELAN's mean shift is for RGB: norm needs colors=3, got {colors}")
        if n_share < 0 or m_elan < 0:
            raise ArchArgumentError("n_share", f"ELAN needs m_elan >= 0 and n_share >= 0, got {m_elan} / {n_share}")
        self.scale = scale
        self.window_sizes = window_sizes
        self.tile_multiple = reduce(math.lcm, window_sizes)
        if norm:
            self.sub_mean: nn.Module = MeanShift(rgb_range, -1)
            self.add_mean: nn.Module = MeanShift(rgb_range, 1)
        else:
            self.sub_mean = self.add_mean = nn.Identity()
        self.head = nn.Sequential(nn.Conv2d(colors, c_elan, 3, 1, 1))
        self.body = nn.Sequential(*[ELAB(c_elan, c_elan, r_expand, i % 2, window_sizes, shared_depth=n_share)
                                    for i in range(m_elan // (1 + n_share))])
        self.tail = nn.Sequential(nn.Conv2d(c_elan, colors * scale * scale, 3, 1, 1), nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.tile_multiple)
        feat = self.head(self.sub_mean(x))
        out = self.add_mean(self.tail(self.body(feat) + feat))
        return out[..., : h * self.scale, : w * self.scale]


__all__ = ["ELAN", "ELAB", "GMSA", "LFE"]

# traiNNer-redux's ELAN is its class default ("elan") and its elan_light builder.
register_presets("ELAN", scale_arg="scale", presets={
    "elan": {},  # 8.31 M parameters at x4
    "elan_light": {"m_elan": 24, "c_elan": 60, "n_share": 1},  # 0.64 M at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """ELAN from its tensors: width and colours from the head, (LFE, GMSA) pairs per block from the first block
    (1 + n_share), blocks, the LFE expansion, the mean shift, the scale from the tail. The window sizes change no
    tensor (the published 4, 8, 16 are kept)."""
    c, colors = s.dim("head.0.weight", 0), s.dim("head.0.weight", 1)
    pairs = sum(f"body.0.modules_lfe.lfe_{i}.conv0.shift_conv.weight" in s for i in range(len(s)))
    if not pairs:
        return []
    return [{"scale": scale, "colors": colors, "norm": "sub_mean.weight" in s, "m_elan": s.count("body.") * pairs,
             "c_elan": c, "n_share": pairs - 1,
             "r_expand": s.dim("body.0.modules_lfe.lfe_0.conv0.shift_conv.conv1x1.weight", 0) // c}
            for out, scale in shuffle_splits(s.dim("tail.0.weight", 0), (colors,)) if out == colors]


register_recogniser("ELAN", _recognise)
