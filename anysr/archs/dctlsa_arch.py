"""DCTLSA: "Densely Connected Transformer with Linear Self-Attention for Lightweight Image Super-Resolution"
(Zeng et al., IEEE Transactions on Instrumentation and Measurement, 2023).

Module names and constructor arguments follow spandrel 0.4.2's ``DCTLSA``, so released checkpoints load with
``strict=True`` and give the same output. Six linear-self-attention blocks (LSAB; two Swin-style layers of
two blocks each) are densely connected through 1x1 convs (LeakyReLU 0.05); each block's attention runs in
16 x 16 windows (every second one cyclically shifted by 8, without a mask, as the original) as *linear*
attention, ``q (softmax_tokens(k)^T v)``, on features that a BatchNorm / depth-wise conv "local" branch
added; a fusion conv, the long shortcut and conv + PixelShuffle follow.

Size requirement: each layer pads its input to a multiple of the 16-pixel window (reflect) and crops its
output, as the original; inputs below 16 pixels per side are first grown to 16 (reflect, then edge
replication; spandrel's minimum) and the output cropped. ``tile_multiple`` is 16.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, Mlp, pad_bottom_right, pad_to_min_size
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

WINDOW = 16
N_MODULES = 6


class LocalModule(nn.Sequential):
    """BatchNorm, 1x1 conv, 3x3 depth-wise conv, BatchNorm, 1x1 conv (no biases)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.add_module("pointwise_prenorm_0", nn.BatchNorm2d(channels))
        self.add_module("pointwise_conv_0", nn.Conv2d(channels, channels, 1, bias=False))
        self.add_module("depthwise_conv", nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False))
        self.add_module("pointwise_prenorm_1", nn.BatchNorm2d(channels))
        self.add_module("pointwise_conv_1", nn.Conv2d(channels, channels, 1, bias=False))


class WindowAttention(nn.Module):
    """Local branch ``l = x + LocalModule(x)``; window linear attention on ``qkv(l)`` per head:
    ``(q * scale) @ (softmax over tokens of k)^T v``; ``proj``, plus ``l``. Works on (b, h, w, c) maps."""

    def __init__(self, dim: int, window_size: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None) -> None:
        super().__init__()
        self.window_size = window_size
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.local = LocalModule(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        ws, heads = self.window_size, self.num_heads
        nh, nw = h // ws, w // ws
        chw = x.permute(0, 3, 1, 2)
        local = (self.local(chw) + chw).permute(0, 2, 3, 1)  # (b, h, w, c)
        qkv = self.qkv(local).reshape(b, nh, ws, nw, ws, 3, heads, c // heads)
        qkv = qkv.permute(5, 0, 1, 3, 6, 2, 4, 7).reshape(3, b * nh * nw, heads, ws * ws, c // heads)
        q, k, v = qkv.unbind(0)
        context = k.softmax(dim=-2).transpose(-2, -1) @ v  # (windows, heads, d, d)
        out = (q * self.scale) @ context  # (windows, heads, tokens, d)
        out = out.reshape(b, nh, nw, heads, ws, ws, c // heads).permute(0, 1, 4, 2, 5, 3, 6).reshape(b, h, w, c)
        return self.proj(out) + local


class SwinTransformerBlock(nn.Module):
    """Cyclic shift by ``shift_size``, window linear attention (its own residual), shift back, ``x + mlp(x)``."""

    def __init__(self, dim: int, num_heads: int, window_size: int = WINDOW, shift_size: int = 0,
                 mlp_ratio: float = 2.0, qkv_bias: bool = True, qk_scale: float | None = None) -> None:
        super().__init__()
        self.shift_size = shift_size
        self.attn = WindowAttention(dim, window_size, num_heads, qkv_bias, qk_scale)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, h, w, c)."""
        s = self.shift_size
        if s:
            x = torch.roll(self.attn(torch.roll(x, (-s, -s), dims=(1, 2))), (s, s), dims=(1, 2))
        else:
            x = self.attn(x)
        return x + self.mlp(x)


class PatchEmbed(nn.Module):
    """A LayerNorm over the channels of the token map (``norm``)."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class BasicLayer(nn.Module):
    """Pad to the window, layer norm, ``depth`` blocks (unshifted / shifted alternately), crop. NCHW in / out."""

    def __init__(self, dim: int, depth: int = 2, num_heads: int = 8, window_size: int = WINDOW,
                 mlp_ratio: float = 2.0, qkv_bias: bool = True, qk_scale: float | None = None) -> None:
        super().__init__()
        self.window_size = window_size
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(dim, num_heads, window_size, 0 if i % 2 == 0 else window_size // 2, mlp_ratio,
                                 qkv_bias, qk_scale) for i in range(depth)
        ])
        self.patch_embed = PatchEmbed(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ws = self.window_size
        x = pad_bottom_right(x, (-h) % ws, (-w) % ws).permute(0, 2, 3, 1)  # (b, H, W, c)
        x = self.patch_embed(x)
        for blk in self.blocks:
            x = blk(x)
        return x.permute(0, 3, 1, 2)[..., :h, :w]


class SwinT(nn.Module):
    """One BasicLayer of two blocks (window 16, MLP ratio 2) in ``transformer_body``."""

    def __init__(self, num_head: int = 5, n_feats: int = 55) -> None:
        super().__init__()
        self.transformer_body = nn.Sequential(BasicLayer(n_feats, 2, num_head, WINDOW, 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.transformer_body(x)


class LSAB(nn.Module):
    """Linear self-attention block: two SwinT layers."""

    def __init__(self, in_channels: int = 55, num_head: int = 5) -> None:
        super().__init__()
        self.body = nn.Sequential(*[SwinT(num_head, in_channels) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _fuse(in_ch: int, out_ch: int) -> nn.Sequential:
    """1x1 conv + LeakyReLU(0.05) (the dense connections)."""
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1), nn.LeakyReLU(0.05, inplace=True))


@ARCH_REGISTRY.register()
class DCTLSA(nn.Module):
    """DCTLSA: 3x3 conv, six densely connected LSABs (B1..B6, fusions c1..c5), fusion ``c`` of all six
    outputs, 3x3 ``LR_conv`` plus the first features, conv + PixelShuffle.

    Args:
        in_nc / out_nc: image channels. nf: width (55; a multiple of num_head). num_modules: 6 (the network
        has six blocks; the argument sets ``c``'s input width in the original and must be 6).
        upscale: integer scale >= 1. num_head: attention heads (5).
    """

    tile_multiple: int = WINDOW

    def __init__(self, in_nc: int = 3, nf: int = 55, num_modules: int = N_MODULES, out_nc: int = 3, upscale: int = 4,
                 num_head: int = 5) -> None:
        super().__init__()
        if isinstance(upscale, bool) or not isinstance(upscale, int) or upscale < 1:
            raise ArchArgumentError("upscale", f"DCTLSA needs an integer upscale >= 1, got {upscale!r}")
        if num_modules != N_MODULES:
            raise ArchArgumentError("num_modules", f"DCTLSA always has {N_MODULES} blocks, got {num_modules!r}")
        if not isinstance(num_head, int) or num_head < 1 or nf % num_head:
            raise ArchArgumentError("num_head", f"DCTLSA needs nf ({nf}) to be a multiple of num_head, "
                                    f"got {num_head!r}")
        self.scale = upscale
        self.fea_conv = nn.Conv2d(in_nc, nf, 3, 1, 1)
        for i in range(1, N_MODULES + 1):
            self.add_module(f"B{i}", LSAB(nf, num_head))
        self.c = _fuse(nf * num_modules, nf)
        for i in range(1, N_MODULES):
            self.add_module(f"c{i}", _fuse(nf * (i + 1), nf))
        self.LR_conv = nn.Conv2d(nf, nf, 3, 1, 1)
        self.upsampler = nn.Sequential(nn.Conv2d(nf, out_nc * upscale**2, 3, 1, 1), nn.PixelShuffle(upscale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, WINDOW)
        fea = self.fea_conv(x)
        dense, outs, inp = fea, [], fea
        for i in range(1, N_MODULES + 1):
            out = getattr(self, f"B{i}")(inp)
            outs.append(out)
            if i < N_MODULES:
                dense = torch.cat([dense, out], dim=1)
                inp = getattr(self, f"c{i}")(dense)
        body = self.c(torch.cat(outs, dim=1))
        return self.upsampler(self.LR_conv(body) + fea)[..., : h * self.scale, : w * self.scale]


__all__ = ["DCTLSA"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("DCTLSA", scale_arg="upscale", presets={
    "dctlsa": {},  # 0.89 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """DCTLSA from its tensors: width and channels from the first conv, scale and output channels from the
    upsampler. The head count changes no tensor: the published 5 when it divides the width, else the divisor
    whose heads are nearest the published 11 channels wide."""
    nf, cin = s.dim("fea_conv.weight", 0), s.dim("fea_conv.weight", 1)
    if "B6.body.0.transformer_body.0.blocks.0.attn.qkv.weight" not in s:
        return []
    heads = sorted((h for h in range(1, nf + 1) if nf % h == 0), key=lambda h: (h != 5, abs(nf // h - 11)))
    return [{"in_nc": cin, "nf": nf, "out_nc": out, "upscale": scale, "num_head": h}
            for out, scale in shuffle_splits(s.dim("upsampler.0.weight", 0), (cin, 3, 1)) for h in heads[:1]]


register_recogniser("DCTLSA", _recognise)
