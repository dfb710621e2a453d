"""RTMoSR: a real-time MoSR (MambaOut-style gated CNN for SR) by umzi2 / the traiNNer-redux community (2025).

Module names and constructor arguments follow traiNNer-redux's ``RTMoSR``, so its checkpoints load with
``strict=True`` and give the same output.

The image (optionally pixel-unshuffled: ``unshuffle_mod`` runs x1 / x2 as x4 on a 4 / 2 times smaller grid) goes
through a re-parameterisable 3x3 stem, ``n_blocks`` gated CNN blocks (RMS norm, a RepConv expansion split into a
gate, an identity part and a part mixed at half resolution by OmniShift depth-wise convs, optional channel
squeeze-excitation), and a RepConv + PixelShuffle head; nearest upsampling of the input is added. Every
``RepConv`` / ``OmniShift`` trains as a sum of branches and runs, in eval mode, as the single conv they fold into
(refolded from the branches on each eval call, as the original refolds on ``eval()``; ``reparameterize()``
freezes the fold for export).

Size requirement: the input is reflect-padded inside forward to a multiple of 2 (``unshuffle_mod``: of 8 at x1,
4 at x2) and the output cropped, so any size works; ``tile_multiple`` is that multiple.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.archs.span_arch import Conv3XC
from anysr.ops.autocast import autocast_off
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class CSELayer(nn.Module):
    """Channel squeeze-excitation: global mean, 1x1 conv down by ``reduction_ratio``, ReLU, 1x1 up, hard sigmoid."""

    def __init__(self, num_channels: int = 48, reduction_ratio: int = 2) -> None:
        super().__init__()
        mid = num_channels // reduction_ratio
        self.squeezing = nn.Sequential(nn.Conv2d(num_channels, mid, 1), nn.ReLU(), nn.Conv2d(mid, num_channels, 1),
                                       nn.Hardsigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.squeezing(x.mean((2, 3), keepdim=True))


class RMSNorm(nn.Module):
    """RMS norm over the channels of an NCHW map: ``x / (||x||_2 / sqrt(C) + eps) * scale + offset``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))
        self.offset = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = x.norm(2, dim=1, keepdim=True) * x.shape[1] ** -0.5
        return x / (rms + self.eps) * self.scale.view(-1, 1, 1) + self.offset.view(-1, 1, 1)


class SeqConv3x3(nn.Module):
    """A 1x1 conv to ``depth_multiplier * out_planes`` channels then a 3x3 conv, on the zero-padded input (so
    the pair folds exactly into one 3x3 conv). Parameters ``k0, b0, k1, b1`` as in ECBSR."""

    def __init__(self, inp_planes: int, out_planes: int, depth_multiplier: int) -> None:
        super().__init__()
        self.inp_planes = inp_planes
        self.out_planes = out_planes
        self.mid_planes = int(out_planes * depth_multiplier)
        first = nn.Conv2d(inp_planes, self.mid_planes, 1)
        second = nn.Conv2d(self.mid_planes, out_planes, 3)
        self.k0, self.b0 = first.weight, first.bias
        self.k1, self.b1 = second.weight, second.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(F.pad(x, (1, 1, 1, 1)), self.k0, self.b0), self.k1, self.b1)

    def rep_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of the equivalent 3x3 conv."""
        # weight[o, c] = sum_m k1[o, m] * k0[m, c], per kernel tap
        weight = (self.k1.permute(2, 3, 0, 1) @ self.k0.flatten(1)).permute(2, 3, 0, 1)
        bias = self.k1.sum((2, 3)) @ self.b0 + self.b1
        return weight, bias


class RepConv(nn.Module):
    """``alpha0 * SeqConv3x3 + alpha1 * conv3x3 + alpha2 * Conv3XC`` while training; one 3x3 conv
    (``conv_3x3_rep``, refolded from the branches) in eval mode."""

    def __init__(self, in_dim: int = 3, out_dim: int = 32) -> None:
        super().__init__()
        self.conv1 = SeqConv3x3(in_dim, out_dim, 2)
        self.conv2 = nn.Conv2d(in_dim, out_dim, 3, 1, 1)
        self.conv3 = Conv3XC(in_dim, out_dim, gain1=2)
        self.conv_3x3_rep = nn.Conv2d(in_dim, out_dim, 3, 1, 1)
        self.conv_3x3_rep.requires_grad_(False)  # derived, never trained
        self.alpha = nn.Parameter(torch.ones(3))
        self.folded = False

    @torch.no_grad()
    def fuse(self) -> None:
        """Write the folded branches into ``conv_3x3_rep`` (computed in the weights' dtype, autocast or not)."""
        with autocast_off(self.alpha):
            w1, b1 = self.conv1.rep_params()
            w3, b3 = self.conv3.fused_weight()
            a = self.alpha
            self.conv_3x3_rep.weight.copy_(a[0] * w1 + a[1] * self.conv2.weight + a[2] * w3)
            self.conv_3x3_rep.bias.copy_(a[0] * b1 + a[1] * self.conv2.bias + a[2] * b3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            a = self.alpha
            return a[0] * self.conv1(x) + a[1] * self.conv2(x) + a[2] * self.conv3(x)
        if not self.folded:
            self.fuse()
        return self.conv_3x3_rep(x)


class OmniShift(nn.Module):
    """Depth-wise ``alpha1 * x + alpha2 * dw1x1 + alpha3 * dw3x3 + alpha4 * dw5x5`` while training; one 5x5
    depth-wise conv (``conv5x5_reparam``, refolded) in eval mode."""

    def __init__(self, dim: int = 48) -> None:
        super().__init__()
        self.conv1x1 = nn.Conv2d(dim, dim, 1, groups=dim)
        self.conv3x3 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.conv5x5 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        for i in range(1, 5):
            setattr(self, f"alpha{i}", nn.Parameter(torch.ones(1, dim, 1, 1)))
        self.conv5x5_reparam = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.conv5x5_reparam.requires_grad_(False)
        self.folded = False

    @torch.no_grad()
    def reparam_5x5(self) -> None:
        """Write the folded branches into ``conv5x5_reparam``."""
        a1, a2, a3, a4 = (getattr(self, f"alpha{i}").view(-1, 1, 1, 1) for i in range(1, 5))
        weight = a4 * self.conv5x5.weight + F.pad(a3 * self.conv3x3.weight, (1, 1, 1, 1))
        # identity and the 1x1 both act on the kernel's centre tap
        weight = weight + F.pad(a1 + a2 * self.conv1x1.weight, (2, 2, 2, 2))
        bias = a2.flatten() * self.conv1x1.bias + a3.flatten() * self.conv3x3.bias + a4.flatten() * self.conv5x5.bias
        self.conv5x5_reparam.weight.copy_(weight)
        self.conv5x5_reparam.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return (self.alpha1 * x + self.alpha2 * self.conv1x1(x) + self.alpha3 * self.conv3x3(x)
                    + self.alpha4 * self.conv5x5(x))
        if not self.folded:
            self.reparam_5x5()
        return self.conv5x5_reparam(x)


class ParPixelUnshuffle(nn.Module):
    """Half-resolution ``pixel_unshuffle(x, down) + RepConv(max_pool(x, down))`` (``in_dim * down**2`` channels)."""

    def __init__(self, in_dim: int, out_dim: int, down: int) -> None:
        super().__init__()
        self.pu = nn.PixelUnshuffle(down)
        self.poll = nn.Sequential(nn.MaxPool2d(down, down), RepConv(in_dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pu(x) + self.poll(x)


class GatedCNNBlock(nn.Module):
    """MambaOut-style gated block: RMS norm, RepConv to ``2 * hidden`` channels split into gate / identity /
    conv parts (the conv part mixed at half resolution), ``fc2(mish(gate) * [identity, conv])``, Mish, residual."""

    def __init__(self, dim: int = 64, expansion_ratio: float = 8 / 3, conv_ratio: float = 1.0, dccm: bool = True,
                 se: bool = False) -> None:
        super().__init__()
        hidden = int(expansion_ratio * dim)
        conv_channels = int(conv_ratio * dim)
        self.norm = RMSNorm(dim)
        self.fc1 = RepConv(dim, hidden * 2)
        self.act = nn.Mish()
        self.split_indices = [hidden, hidden - conv_channels, conv_channels]
        self.conv = nn.Sequential(ParPixelUnshuffle(dim, dim * 4, 2), OmniShift(dim * 4),
                                  CSELayer(dim * 4) if se else nn.Identity(), nn.PixelShuffle(2))
        self.fc2 = RepConv(hidden, dim) if dccm else nn.Conv2d(hidden, dim, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, ident, part = torch.split(self.fc1(self.norm(x)), self.split_indices, dim=1)
        mixed = torch.cat((ident, self.conv(part)), dim=1)
        return self.act(self.fc2(self.act(gate) * mixed)) + x


@ARCH_REGISTRY.register()
class RTMoSR(nn.Module):
    """RTMoSR: RepConv stem (after a pixel-unshuffle with ``unshuffle_mod``), gated CNN blocks, RepConv +
    PixelShuffle head, plus the nearest-upsampled input. RGB in and out.

    Args:
        scale: 1, 2, 3 or 4 (any integer >= 1; ``unshuffle_mod`` refuses 3). dim: body width.
        ffn_expansion: hidden width of the gated blocks per ``dim`` (>= 1). n_blocks: gated blocks.
        unshuffle_mod: below x4, work at 1/(4 // scale) resolution (the "L" / "UL" presets).
        dccm: RepConv (3x3) instead of a 1x1 conv as the blocks' output projection. se: channel SE in the blocks.
    """

    tile_multiple: int = 2  # set per instance: 2 * the unshuffle factor

    def __init__(self, scale: int = 2, dim: int = 32, ffn_expansion: float = 2, n_blocks: int = 2,
                 unshuffle_mod: bool = False, dccm: bool = True, se: bool = True) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"RTMoSR needs an integer scale >= 1, got {scale!r}")
        if int(ffn_expansion * dim) < dim:
            raise ArchArgumentError("ffn_expansion", f"RTMoSR needs ffn_expansion >= 1 (the blocks split "
                                    f"int(ffn_expansion * dim) channels into dim and the rest), got {ffn_expansion!r}")
        unshuffle = 0
        if unshuffle_mod and scale < 4:
            if scale == 3:
                raise ArchArgumentError("unshuffle_mod", "RTMoSR's unshuffle_mod does not support scale 3")
            unshuffle = 4 // scale
        self.scale = scale
        self.in_channels = 3  # what export / inference feed (the first conv may see pixel-unshuffled channels)
        head_scale = 4 if unshuffle else scale
        self.pad = 2 * (unshuffle or 1)
        self.tile_multiple = self.pad
        if unshuffle:
            self.to_feat: nn.Module = nn.Sequential(nn.PixelUnshuffle(unshuffle), RepConv(3 * unshuffle**2, dim))
        else:
            self.to_feat = RepConv(3, dim)
        self.body = nn.Sequential(*[GatedCNNBlock(dim, ffn_expansion, dccm=dccm, se=se) for _ in range(n_blocks)])
        self.to_img = nn.Sequential(RepConv(dim, 3 * head_scale**2), nn.PixelShuffle(head_scale))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def reparameterize(self) -> RTMoSR:
        """The deployment form: fold every RepConv / OmniShift once and use the folded convs from then on (what
        export traces). The state dict keeps its keys; do not train it further."""
        for module in self.modules():
            if isinstance(module, RepConv):
                module.fuse()
                module.folded = True
            elif isinstance(module, OmniShift):
                module.reparam_5x5()
                module.folded = True
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        feat = self.body(self.to_feat(pad_to_multiple(x, self.pad)[0]))
        out = self.to_img(feat)[..., : h * self.scale, : w * self.scale]
        return out + F.interpolate(x, scale_factor=self.scale, mode="nearest")


__all__ = ["RTMoSR", "GatedCNNBlock", "RepConv", "OmniShift"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("RTMoSR", scale_arg="scale", presets={
    "rtmosr_l": {"unshuffle_mod": True},  # 2.98 M stored at x2 (0.24 M in the folded deployment form)
    "rtmosr_ul": {"ffn_expansion": 1.5, "unshuffle_mod": True, "dccm": False},  # 2.23 M stored at x2 (0.19 M folded)
})


def _recognise(s: StateShapes) -> list[dict]:
    """RTMoSR from its tensors: the stem (a RepConv, after a pixel-unshuffle by 4 // scale with unshuffle_mod)
    gives width and scale, the head's PixelShuffle width the scale otherwise, the gated blocks their count,
    hidden width, output projection (RepConv: dccm) and channel SE."""
    if "to_feat.conv2.weight" in s:
        dim, fold = s.dim("to_feat.conv2.weight", 0), 1
    else:
        dim = s.dim("to_feat.1.conv2.weight", 0)
        fold = round((s.dim("to_feat.1.conv2.weight", 1) / 3) ** 0.5)
    heads = [sc for _, sc in shuffle_splits(s.dim("to_img.0.conv2.weight", 0), (3,))]
    common: dict = {"dim": dim, "n_blocks": s.count("body.")}
    if common["n_blocks"]:
        common["ffn_expansion"] = width_ratio(s.dim("body.0.fc1.conv2.weight", 0) // 2, dim, 2)
        common["dccm"] = "body.0.fc2.conv2.weight" in s
        common["se"] = "body.0.conv.2.squeezing.0.weight" in s
    if fold == 1:
        return [{**common, "scale": sc, "unshuffle_mod": False} for sc in heads]
    return [{**common, "scale": 4 // fold, "unshuffle_mod": True}] if heads == [4] and fold in (2, 4) else []


register_recogniser("RTMoSR", _recognise)
