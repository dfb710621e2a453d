"""EIMN: "Efficient Information Modulation Network for Image Super-Resolution" (Liu et al., ECAI 2023), as
traiNNer-redux trains it.

Module names and constructor arguments follow traiNNer-redux's ``EIMN`` so its checkpoints load with
``strict=True`` and give the same output. A 3x3 stem feeds ``num_stages`` stages of ``depths`` blocks, each stage
closed by a layer norm over the channels; a long shortcut and a 3x3 conv + pixel shuffle head follow. A block is
two layer-scaled residual steps after batch norms: MOLRCM (a gated multi-order long-range convolution: a 5x5
depth-wise conv on a GELU query, then dilated 5x5 / 7x7 depth-wise convs on 3/8 and 4/8 of the channels, a 1x1
fusion, SiLU gate, times a 1x1 value) and SADFFM (a gated depth-wise feed-forward followed by a dual
channel / spatial attention gate).

Size requirement: none (convolutions only); ``tile_multiple`` is 1.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, DropPath, LayerNorm2d
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class DFFM(nn.Module):
    """Dual attention gate: a per-channel gate from the pooled features and a per-pixel gate from the local and
    the pooled reduced features; the input is multiplied by both."""

    def __init__(self, in_channels: int, act_ratio: float = 0.25) -> None:
        super().__init__()
        reduced = int(in_channels * act_ratio)
        self.norm = LayerNorm2d(in_channels)
        self.global_reduce = nn.Conv2d(in_channels, reduced, 1)
        self.local_reduce = nn.Conv2d(in_channels, reduced, 1)
        self.act_fn = nn.GELU()
        self.channel_expand = nn.Conv2d(reduced, in_channels, 1)
        self.spatial_expand = nn.Conv2d(reduced * 2, 1, 1)
        self.gate_fn = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        pooled = self.act_fn(self.global_reduce(y.mean((2, 3), keepdim=True)))
        local = self.act_fn(self.local_reduce(y))
        channel = torch.sigmoid(self.channel_expand(pooled))
        spatial = torch.sigmoid(self.spatial_expand(torch.cat((local, pooled.expand_as(local)), dim=1)))
        return x * (channel * spatial)


class SADFFM(nn.Module):
    """1x1 to two hidden halves, a depth-wise 3x3 over both, ``gelu(a) * b``, 1x1 back, the DFFM gate, dropout."""

    def __init__(self, dim: int, expand_ratio: float, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        hidden = int(dim * expand_ratio)
        self.linear_in = nn.Conv2d(dim, hidden * 2, 1, bias=bias)
        self.SAL = nn.Conv2d(hidden * 2, hidden * 2, 3, 1, 1, groups=hidden * 2, bias=bias)
        self.linear_out = nn.Conv2d(hidden, dim, 1, bias=bias)
        self.DFFM = DFFM(dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.SAL(self.linear_in(x)).chunk(2, dim=1)
        return self.drop(self.DFFM(self.linear_out(F.gelu(a) * b)))


class MOLRCM(nn.Module):
    """Multi-order long-range convolutional modulation (see the module docstring)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.split_c1, self.split_c2, self.split_c3 = int(3 / 8 * dim), int(1 / 8 * dim), int(4 / 8 * dim)
        c1, c3 = self.split_c1, self.split_c3
        self.region = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.spatial_1 = nn.Conv2d(c1, c1, 5, padding=4, groups=c1, dilation=2)
        self.spatial_2 = nn.Conv2d(c3, c3, 7, padding=9, groups=c3, dilation=3)
        self.fusion = nn.Conv2d(dim, dim, 1)
        self.proj_value = nn.Sequential(nn.Conv2d(dim, dim, 1))
        self.proj_query = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU())
        self.out = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        query = self.region(self.proj_query(x))
        q1, q2, q3 = torch.split(query, (self.split_c1, self.split_c2, self.split_c3), dim=1)
        mixed = F.silu(self.fusion(torch.cat((self.spatial_1(q1), q2, self.spatial_2(q3)), dim=1)))
        return self.out(mixed * self.proj_value(x))


class EIMNBlock(nn.Module):
    """``x + s1 * MOLRCM(bn1(x))``, then ``+ s2 * SADFFM(bn2(.))`` (layer scales start at 0.01)."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0, bias: bool = True, drop: float = 0.0,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(dim)
        self.attn = MOLRCM(dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.BatchNorm2d(dim)
        self.mlp = SADFFM(dim, mlp_ratio, bias, drop)
        self.layer_scale_1 = nn.Parameter(torch.full((dim,), 1e-2))
        self.layer_scale_2 = nn.Parameter(torch.full((dim,), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.layer_scale_1.view(-1, 1, 1) * self.attn(self.norm1(x)))
        return x + self.drop_path(self.layer_scale_2.view(-1, 1, 1) * self.mlp(self.norm2(x)))


@ARCH_REGISTRY.register()
class EIMN(nn.Module):
    """EIMN (defaults: EIMN_L at x2; the preset eimn_a has 14 stages). ``freeze_param`` trains the head only."""

    tile_multiple: int = 1

    def __init__(self, embed_dims: int = 64, scale: int = 2, depths: int = 1, mlp_ratios: float = 2.66,
                 drop_rate: float = 0.0, drop_path_rate: float = 0.0, num_stages: int = 16,
                 freeze_param: bool = False) -> None:
        super().__init__()
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"EIMN needs an integer scale >= 1, got {scale!r}")
        if not isinstance(embed_dims, int) or embed_dims < 8 or embed_dims % 8:
            raise ArchArgumentError("embed_dims", f"EIMN needs embed_dims to be a multiple of 8 (its 3/8, 1/8, 4/8 "
                                                  f"channel split), got {embed_dims!r}")
        self.num_stages = num_stages
        rates = torch.linspace(0, drop_path_rate, depths * num_stages, device="cpu").tolist()  # build-time numbers
        self.head = nn.Sequential(nn.Conv2d(3, embed_dims, 3, 1, 1))
        self.tail = nn.Sequential(nn.Conv2d(embed_dims, 3 * scale * scale, 3, 1, 1), nn.PixelShuffle(scale))
        for i in range(num_stages):
            blocks = nn.ModuleList(EIMNBlock(embed_dims, mlp_ratios, drop=drop_rate, drop_path=rates[i * depths + j])
                                   for j in range(depths))
            setattr(self, f"block{i + 1}", blocks)
            setattr(self, f"norm{i + 1}", LayerNorm2d(embed_dims, eps=1e-5))  # nn.LayerNorm over the channels
        if freeze_param:
            self.freeze_param()

    def freeze_param(self) -> None:
        """Train the ``tail`` only."""
        for name, param in self.named_parameters():
            param.requires_grad = name.split(".")[0] == "tail"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.head(x)
        out = feat
        for i in range(1, self.num_stages + 1):
            for block in getattr(self, f"block{i}"):
                out = block(out)
            out = getattr(self, f"norm{i}")(out)
        return self.tail(feat + out)


# traiNNer-redux's builders (tests/test_presets.py checks each against the network traiNNer-redux builds)
register_presets("EIMN", scale_arg="scale", presets={"eimn_l": {"num_stages": 16}, "eimn_a": {"num_stages": 14}})


def _recognise(s: StateShapes) -> list[dict]:
    """EIMN from its tensors: width from the head, stages from the norms, blocks per stage, the scale from the
    tail (RGB x scale**2), the MLP ratio from its hidden width (the published 2.66 when it gives that width)."""
    dims = s.dim("head.0.weight", 0)
    hidden = s.dim("block1.0.mlp.linear_out.weight", 1)
    common = {"embed_dims": dims, "scale": round((s.dim("tail.0.weight", 0) // 3) ** 0.5),
              "depths": s.count("block1."), "num_stages": sum(f"norm{i}.weight" in s for i in range(1, len(s)))}
    ratios = [2.66] if int(dims * 2.66) == hidden else []
    return [{**common, "mlp_ratios": r} for r in [*ratios, hidden / dims]]


register_recogniser("EIMN", _recognise)
