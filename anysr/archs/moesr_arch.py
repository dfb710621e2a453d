"""MoESR: MambaOut Excitation Super-Resolution (umzi2 / rewaifu, 2024; no paper, code in resselt and
traiNNer-redux): gated CNN blocks after MambaOut (Yu & Wang) with Inception depth-wise convs after InceptionNeXt
(Yu et al., CVPR 2024).

Module names, the ``upscale.MetaUpsample`` buffer and constructor arguments follow spandrel 0.4.2's ``MoESR``,
so released checkpoints load with ``strict=True`` and give the same output. A 3x3 stem feeds ``n_blocks``
groups of ``n_block`` gated CNN blocks (channel layer norm, 3x3 conv to gated halves, Inception depth-wise
convs on part of one half, Mish, a learned per-channel ``gamma``) and one multi-scale gate (MSG: the same
blocks at half resolution between a pixel-unshuffle and a pixel-shuffle); a long shortcut and one of five
heads follow: "conv" (scale 1), "pixelshuffledirect", "pixelshuffle", "nearest+conv" or "dysample".

Size requirement: odd sides are padded by one row / column (reflect, edge replication for a 1-pixel side)
for the half-resolution gate, and the output cropped; ``tile_multiple`` is 2.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, NearestUpsample, pad_to_multiple
from anysr.archs.plksr_arch import DySample, dysample_scale
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.registry import ARCH_REGISTRY

SAMPLE_MODS = ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "dysample")


def _power_of_two_or_3(scale: int) -> bool:
    return scale == 3 or scale & (scale - 1) == 0


class UniUpsample(nn.Sequential):
    """The upsampling head, with a ``MetaUpsample`` uint8 buffer that records (version 1, head index, scale,
    in_dim, out_dim, mid_dim, group) as released checkpoints carry it."""

    def __init__(self, upsample: str, scale: int = 2, in_dim: int = 64, out_dim: int = 3, mid_dim: int = 64,
                 group: int = 4) -> None:
        layers: list[nn.Module] = []
        if scale == 1 or upsample == "conv":
            layers.append(nn.Conv2d(in_dim, out_dim, 3, 1, 1))
        elif upsample == "pixelshuffledirect":
            layers += [nn.Conv2d(in_dim, out_dim * scale**2, 3, 1, 1), nn.PixelShuffle(scale)]
        elif upsample == "pixelshuffle":
            layers += [nn.Conv2d(in_dim, mid_dim, 3, 1, 1), nn.LeakyReLU(inplace=True)]
            steps = [3] if scale == 3 else [2] * int(math.log2(scale))
            for s in steps:
                layers += [nn.Conv2d(mid_dim, s * s * mid_dim, 3, 1, 1), nn.PixelShuffle(s)]
            layers.append(nn.Conv2d(mid_dim, out_dim, 3, 1, 1))
        elif upsample == "nearest+conv":
            steps = [3] if scale == 3 else [2] * int(math.log2(scale))
            for s in steps:
                layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), NearestUpsample(s),
                           nn.LeakyReLU(0.2, inplace=True)]
            layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                       nn.Conv2d(in_dim, out_dim, 3, 1, 1)]
        else:  # dysample
            layers.append(DySample(in_dim, out_dim, scale, group))
        super().__init__(*layers)
        meta = [1, SAMPLE_MODS.index(upsample), scale, in_dim, out_dim, mid_dim, group]
        self.register_buffer("MetaUpsample", torch.tensor([v % 256 for v in meta], dtype=torch.uint8))


class InceptionDWConv2d(nn.Module):
    """Inception depth-wise conv: of the channels, ``branch_ratio`` go through a square, a 1 x band and a
    band x 1 depth-wise conv each; the rest pass unchanged (they come first)."""

    def __init__(self, in_channels: int, square_kernel_size: int = 3, band_kernel_size: int = 11,
                 branch_ratio: float = 0.125) -> None:
        super().__init__()
        gc = int(in_channels * branch_ratio)
        sq, band = square_kernel_size, band_kernel_size
        self.dwconv_hw = nn.Conv2d(gc, gc, sq, padding=sq // 2, groups=gc)
        self.dwconv_w = nn.Conv2d(gc, gc, (1, band), padding=(0, band // 2), groups=gc)
        self.dwconv_h = nn.Conv2d(gc, gc, (band, 1), padding=(band // 2, 0), groups=gc)
        self.split_indexes = [in_channels - 3 * gc, gc, gc, gc]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ident, hw, w, h = torch.split(x, self.split_indexes, dim=1)
        return torch.cat((ident, self.dwconv_hw(hw), self.dwconv_w(w), self.dwconv_h(h)), dim=1)


class GatedCNNBlock(nn.Module):
    """Gated CNN unit: ``x + gamma * mish(fc2(mish(g) * cat(i, inception(c))))`` with ``g, i, c`` split from
    ``fc1(norm(x))``."""

    def __init__(self, dim: int = 64, expansion_ratio: float = 8 / 3, conv_ratio: float = 1.0) -> None:
        super().__init__()
        hidden = int(expansion_ratio * dim)
        conv_channels = int(conv_ratio * dim)
        self.norm = LayerNorm2d(dim)
        self.fc1 = nn.Conv2d(dim, hidden * 2, 3, 1, 1)
        self.act = nn.Mish()
        self.split_indices = [hidden, hidden - conv_channels, conv_channels]
        self.conv = InceptionDWConv2d(conv_channels)
        self.fc2 = nn.Conv2d(hidden, dim, 3, 1, 1)
        self.gamma = nn.Parameter(torch.ones(1, dim, 1, 1))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, ident, conv = torch.split(self.fc1(self.norm(x)), self.split_indices, dim=1)
        y = self.act(self.fc2(self.act(gate) * torch.cat((ident, self.conv(conv)), dim=1)))
        return y * self.gamma + x


class MSG(nn.Module):
    """Multi-scale gate: conv to dim/4 + PixelUnshuffle(2) + LeakyReLU, three gated blocks at half resolution,
    conv + PixelShuffle(2) + LeakyReLU, plus the input."""

    def __init__(self, dim: int, expansion_msg: float = 1.5) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.PixelUnshuffle(2), nn.LeakyReLU(0.1, True))
        self.gated = nn.Sequential(*[GatedCNNBlock(dim, expansion_ratio=expansion_msg) for _ in range(3)])
        self.up = nn.Sequential(nn.Conv2d(dim, dim * 4, 3, 1, 1), nn.PixelShuffle(2), nn.LeakyReLU(0.1, True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.gated(self.down(x))) + x


class Blocks(nn.Module):
    """``blocks`` gated CNN blocks, then an MSG."""

    def __init__(self, dim: int = 64, blocks: int = 4, expansion_factor: float = 1.5,
                 expansion_msg: float = 1.5) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[GatedCNNBlock(dim, expansion_factor) for _ in range(blocks)])
        self.msg = MSG(dim, expansion_msg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.msg(self.blocks(x))


@ARCH_REGISTRY.register()
class MoESR(nn.Module):
    """MoESR: 3x3 stem, ``n_blocks`` Blocks with a long shortcut, the upsampling head.

    Args:
        in_ch / out_ch: image channels. scale: integer scale >= 1 (1 with upsampler "conv"; 2**n or 3 for
        "pixelshuffle" and "nearest+conv"). dim: width (a multiple of 4). n_blocks: groups.
        n_block: gated blocks per group. expansion_factor / expansion_msg: hidden width factors of the
        blocks and of the MSG blocks. upsampler: one of "conv", "pixelshuffledirect", "pixelshuffle",
        "nearest+conv", "dysample". upsample_dim: width of the "pixelshuffle" head.
    """

    tile_multiple: int = 2
    # traiNNer-redux's MoESR2 is this network (same keys, MetaUpsample and outputs; tests/archs/test_escmix.py).
    # Its expansion_factor default is 8/3 rather than 2.65625: the same hidden width for dim 64 (170), not for
    # every dim.
    other_names = ("MoESR2",)

    def __init__(self, in_ch: int = 3, out_ch: int = 3, scale: int = 4, dim: int = 64, n_blocks: int = 9,
                 n_block: int = 4, expansion_factor: float = 2.65625, expansion_msg: float = 1.5,
                 upsampler: str = "pixelshuffledirect", upsample_dim: int = 64) -> None:
        super().__init__()
        if upsampler not in SAMPLE_MODS:
            raise ArchArgumentError("upsampler", f"MoESR knows the upsamplers {list(SAMPLE_MODS)}, got {upsampler!r}")
        if upsampler == "conv":
            scale = 1
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"MoESR needs an integer scale >= 1, got {scale!r}")
        if upsampler in ("pixelshuffle", "nearest+conv") and not _power_of_two_or_3(scale):
            raise ArchArgumentError("scale", f"MoESR's {upsampler} head supports scales 2**n and 3, got {scale}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8 or dim % 4:
            raise ArchArgumentError("dim", f"MoESR needs dim to be a multiple of 4 (at least 8: the Inception "
                                    f"convs take dim / 8 channels each), got {dim!r}")
        self.scale = scale
        self.in_to_dim = nn.Conv2d(in_ch, dim, 3, 1, 1)
        self.blocks = nn.Sequential(*[Blocks(dim, n_block, expansion_factor, expansion_msg)
                                      for _ in range(n_blocks)])
        self.upscale = UniUpsample(upsampler, scale, dim, out_ch, upsample_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, 2)
        feat = self.in_to_dim(x)
        return self.upscale(self.blocks(feat) + feat)[..., : h * self.scale, : w * self.scale]


__all__ = ["MoESR"]


def uniupsample_heads(s: StateShapes, prefix: str, out_dims: tuple[int, ...]) -> list[dict]:
    """The ``UniUpsample`` / ``UniUpsampleV3`` heads at ``prefix`` that fit its tensors: {"upsampler", "scale",
    "out" (its output channels), "mid_dim" (only "pixelshuffle" shows it)}. The ``MetaUpsample`` record is a
    buffer whose shape says nothing. A lone conv is "pixelshuffledirect" (``out_dims``: the output channels to
    try for its PixelShuffle) or "conv" at a scale its tensors do not show ("scale": None); the "nearest+conv"
    head's one step is x2 or x3 alike in its tensors (the scale the ``MetaUpsample`` record holds is proposed
    first when the file has its values, else x2)."""
    meta = s.integers(f"{prefix}MetaUpsample")
    heads = _uniupsample_heads(s, prefix, out_dims)
    return sorted(heads, key=lambda h: h["scale"] != meta[2]) if meta and len(meta) == 7 else heads


def _uniupsample_heads(s: StateShapes, prefix: str, out_dims: tuple[int, ...]) -> list[dict]:
    if f"{prefix}0.offset.weight" in s:
        return [{"upsampler": "dysample", "scale": dysample_scale(s, f"{prefix}0."),
                 "out": s.dim(f"{prefix}0.end_conv.weight", 0)}]
    convs = [i for i in s.indices(prefix) if f"{prefix}{i}.weight" in s]
    first = s.shape(f"{prefix}{convs[0]}.weight")
    out = s.dim(f"{prefix}{convs[-1]}.weight", 0)
    if len(convs) == 1:
        return [{"upsampler": "pixelshuffledirect", "scale": sc, "out": c} for c, sc in shuffle_splits(out, out_dims)] \
            + [{"upsampler": "conv", "scale": None, "out": out}]
    if len(convs) == 2 or len(convs) == 3 and first[2] == 4:  # ConvTranspose2d(s) (kernel 4: x2, 3: x3), conv
        scale = 4 if len(convs) == 3 else (2 if first[2] == 4 else 3)
        return [{"upsampler": "transpose+conv", "scale": scale, "out": out}]
    if convs[1] == 2:  # conv to mid_dim, LeakyReLU, then conv + PixelShuffle steps, conv
        mid = first[0]
        steps = [s.dim(f"{prefix}{i}.weight", 0) // mid for i in convs[1:-1]]
        return [{"upsampler": "pixelshuffle", "scale": 3 if steps == [9] else 2 ** len(steps), "mid_dim": mid,
                 "out": out}]
    steps = len(convs) - 2  # (conv, nearest, LeakyReLU) per step, then conv, LeakyReLU, conv
    return [{"upsampler": "nearest+conv", "scale": sc, "out": out} for sc in ((2, 3) if steps == 1 else (2**steps,))]


def _recognise(s: StateShapes) -> list[dict]:
    """MoESR from its tensors: image channels and width from the first conv, groups and gated blocks per group
    from the body, hidden widths from the first group's blocks and MSG, the head (kind, scale, output channels,
    pixelshuffle width) from its names and shapes."""
    cin, dim = s.dim("in_to_dim.weight", 1), s.dim("in_to_dim.weight", 0)
    s.shape("blocks.0.msg.down.0.weight")
    n_block = s.count("blocks.0.blocks.")
    common: dict = {"in_ch": cin, "dim": dim, "n_blocks": s.count("blocks."), "n_block": n_block,
                    "expansion_msg": width_ratio(s.dim("blocks.0.msg.gated.0.fc1.weight", 0) // 2, dim, 1.5)}
    if n_block:
        common["expansion_factor"] = width_ratio(s.dim("blocks.0.blocks.0.fc1.weight", 0) // 2, dim, 2.65625)
    out = []
    for head in uniupsample_heads(s, "upscale.", tuple(dict.fromkeys((cin, 3, 1)))):
        p = {**common, "out_ch": head["out"], "upsampler": head["upsampler"], "scale": head["scale"] or 1}
        if "mid_dim" in head:
            p["upsample_dim"] = head["mid_dim"]
        out.append(p)
    return out


register_recogniser("MoESR", _recognise)
