"""MixDehazeNet: "Mix Structure Block For Image Dehazing Network" (Lu, Wang, Zhao, Dong, Wei, Zhang, Lin;
IJCNN 2024).

Module names and constructor arguments follow the authors' code (as in spandrel 0.4.2), so released checkpoints
load with ``strict=True`` and give the same output.

A three-level U-Net (DehazeFormer layout, selective-kernel fusion of the skips) of mix structure blocks: a
multi-scale parallel large-kernel module (dilated depth-wise 7x7 / 5x5 / 3x3 convs with reflect padding, mixed by
an MLP) and an enhanced parallel attention module (simple channel attention, channel attention and pixel
attention, mixed by an MLP), each with batch norm and a residual. The head predicts ``K`` and ``B`` of the
atmospheric model and the output is ``K * x - B + x``. Scale 1. This is the raw network: the authors train and
test on images scaled to [-1, 1] (output likewise; spandrel's call API feeds [0, 1] images unchanged and maps the
output by ``out * 0.5 + 0.5``), so scale inputs / outputs as the weights in use expect.

Size requirement: the quarter-resolution level needs more than 9 pixels per side for its reflect-padded dilated
convs, so inputs are grown to at least 40 pixels (reflect, then edge; spandrel's minimum) and padded to a multiple
of 4 (reflect, as the authors' ``check_image_size``) inside ``forward``; the output is cropped. ``tile_multiple``
is 4.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, pad_to_min_size, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

PATCH = 4
MIN_SIZE = 40


class GlobalAvgPool(nn.Module):
    """Mean over height and width (``nn.AdaptiveAvgPool2d(1)``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3), keepdim=True)


def _mixer(dim: int) -> nn.Sequential:
    """1x1 conv from 3 x dim to 4 x dim, GELU, 1x1 conv to dim."""
    return nn.Sequential(nn.Conv2d(dim * 3, dim * 4, 1), nn.GELU(), nn.Conv2d(dim * 4, dim, 1))


def _dilated_dw(dim: int, k: int) -> nn.Conv2d:
    """Depth-wise k x k conv with dilation 3, reflect padding (receptive field 3k - 2)."""
    return nn.Conv2d(dim, dim, k, padding=3 * (k // 2), groups=dim, dilation=3, padding_mode="reflect")


class MixStructureBlock(nn.Module):
    """Multi-scale parallel large-kernel module, then enhanced parallel attention, each ``x + f(BN(x))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(dim)
        self.norm2 = nn.BatchNorm2d(dim)
        self.conv1 = nn.Conv2d(dim, dim, 1)
        self.conv2 = nn.Conv2d(dim, dim, 5, padding=2, padding_mode="reflect")
        self.conv3_19 = _dilated_dw(dim, 7)
        self.conv3_13 = _dilated_dw(dim, 5)
        self.conv3_7 = _dilated_dw(dim, 3)
        self.Wv = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.Conv2d(dim, dim, 3, padding=1, groups=dim,
                                                                  padding_mode="reflect"))
        self.Wg = nn.Sequential(GlobalAvgPool(), nn.Conv2d(dim, dim, 1), nn.Sigmoid())
        self.ca = nn.Sequential(GlobalAvgPool(), nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 1),
                                nn.Sigmoid())
        self.pa = nn.Sequential(nn.Conv2d(dim, dim // 8, 1), nn.GELU(), nn.Conv2d(dim // 8, 1, 1), nn.Sigmoid())
        self.mlp = _mixer(dim)
        self.mlp2 = _mixer(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(self.norm1(x)))
        x = x + self.mlp(torch.cat([self.conv3_19(y), self.conv3_13(y), self.conv3_7(y)], 1))
        y = self.norm2(x)
        return x + self.mlp2(torch.cat([self.Wv(y) * self.Wg(y), self.ca(y) * y, self.pa(y) * y], 1))


class BasicLayer(nn.Module):
    """``depth`` mix structure blocks."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MixStructureBlock(dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


class PatchEmbed(nn.Module):
    """Reflect-padded conv with stride ``patch_size`` (a stem, or a downsampling patch merge)."""

    def __init__(self, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96,
                 kernel_size: int | None = None) -> None:
        super().__init__()
        k = kernel_size or patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, k, stride=patch_size, padding=(k - patch_size + 1) // 2,
                              padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class PatchUnEmbed(nn.Module):
    """Reflect-padded conv to ``out_chans * patch_size**2`` channels, then PixelShuffle(``patch_size``)."""

    def __init__(self, patch_size: int = 4, out_chans: int = 3, embed_dim: int = 96,
                 kernel_size: int | None = None) -> None:
        super().__init__()
        k = kernel_size or 1
        self.proj = nn.Sequential(nn.Conv2d(embed_dim, out_chans * patch_size**2, k, padding=k // 2,
                                            padding_mode="reflect"), nn.PixelShuffle(patch_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class SKFusion(nn.Module):
    """Selective-kernel fusion of ``height`` maps: softmax weights (over the maps, per channel) from the pooled
    sum, then the weighted sum."""

    def __init__(self, dim: int, height: int = 2, reduction: int = 8) -> None:
        super().__init__()
        self.height = height
        d = max(int(dim / reduction), 4)
        self.avg_pool = GlobalAvgPool()
        self.mlp = nn.Sequential(nn.Conv2d(dim, d, 1, bias=False), nn.ReLU(), nn.Conv2d(d, dim * height, 1,
                                                                                        bias=False))

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(list(feats), 1)  # (b, height, c, h, w)
        b, _, c = stacked.shape[:3]
        attn = self.mlp(self.avg_pool(stacked.sum(1))).reshape(b, self.height, c, 1, 1).softmax(1)
        return (stacked * attn).sum(1)


@ARCH_REGISTRY.register()
class MixDehazeNet(nn.Module):
    """MixDehazeNet (x1). Output ``K * x - B + x`` with ``(K, B)`` from the last 4 channels of the head.

    Args:
        in_chans: image channels (3). out_chans: head channels, 4 (K and RGB B).
        embed_dims: widths of levels 1, 2, 3 and of the decoder levels 2, 1 (``[1] == [3]``, ``[0] == [4]``).
        depths: blocks per level (t: [1, 1, 2, 1, 1], s: [2, 2, 4, 2, 2], b: [4, 4, 8, 4, 4], l: [8, 8, 16, 8, 8]).
    """

    image_range = (-1.0, 1.0)  # the authors' images; anysr's pipeline feeds [0, 1] (arch_util.unit_range)

    tile_multiple: int = PATCH

    def __init__(self, *, in_chans: int = 3, out_chans: int = 4, embed_dims: Sequence[int] = (24, 48, 96, 48, 24),
                 depths: Sequence[int] = (1, 1, 2, 1, 1)) -> None:
        super().__init__()
        if len(embed_dims) != 5 or len(depths) != 5:
            raise ArchArgumentError("embed_dims" if len(embed_dims) != 5 else "depths",
                                    "MixDehazeNet needs 5 entries (3 encoder levels, 2 decoder levels)")
        if embed_dims[1] != embed_dims[3] or embed_dims[0] != embed_dims[4]:
            raise ArchArgumentError("embed_dims", f"MixDehazeNet's decoder widths must mirror the encoder's "
                                    f"(embed_dims[1] == [3], [0] == [4]), got {list(embed_dims)}")
        if any(d < 8 for d in embed_dims):
            raise ArchArgumentError("embed_dims", f"MixDehazeNet needs widths of at least 8 (pixel attention "
                                    f"uses dim // 8 channels), got {list(embed_dims)}")
        if out_chans != in_chans + 1:
            raise ArchArgumentError("out_chans", f"MixDehazeNet's head gives K (1 channel) and B (in_chans "
                                    f"channels): out_chans must be in_chans + 1 = {in_chans + 1}, got {out_chans}")
        self.patch_size = PATCH
        self.in_chans = in_chans
        e0, e1, e2, e3, e4 = embed_dims
        self.patch_embed = PatchEmbed(1, in_chans, e0, kernel_size=3)
        self.layer1 = BasicLayer(e0, depths[0])
        self.patch_merge1 = PatchEmbed(2, e0, e1, kernel_size=3)
        self.skip1 = nn.Conv2d(e0, e0, 1)
        self.layer2 = BasicLayer(e1, depths[1])
        self.patch_merge2 = PatchEmbed(2, e1, e2, kernel_size=3)
        self.skip2 = nn.Conv2d(e1, e1, 1)
        self.layer3 = BasicLayer(e2, depths[2])
        self.patch_split1 = PatchUnEmbed(2, e3, e2)
        self.fusion1 = SKFusion(e3)
        self.layer4 = BasicLayer(e3, depths[3])
        self.patch_split2 = PatchUnEmbed(2, e4, e3)
        self.fusion2 = SKFusion(e4)
        self.layer5 = BasicLayer(e4, depths[4])
        self.patch_unembed = PatchUnEmbed(1, out_chans, e4, kernel_size=3)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.patch_embed(x))
        skip1 = x
        x = self.layer2(self.patch_merge1(x))
        skip2 = x
        x = self.patch_split1(self.layer3(self.patch_merge2(x)))
        x = self.fusion1([x, self.skip2(skip2)]) + x
        x = self.patch_split2(self.layer4(x))
        x = self.fusion2([x, self.skip1(skip1)]) + x
        return self.patch_unembed(self.layer5(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(pad_to_min_size(x, MIN_SIZE), PATCH)
        k, b = self.forward_features(x).split([1, self.in_chans], 1)
        return (k * x - b + x)[..., :h, :w]


__all__ = ["MixDehazeNet", "MixStructureBlock"]


def _recognise(s: StateShapes) -> dict:
    """MixDehazeNet from its tensors: image channels and level widths from the embedding convs, the blocks per
    level from the layers."""
    dims = [s.dim("patch_embed.proj.weight", 0), s.dim("patch_merge1.proj.weight", 0),
            s.dim("patch_merge2.proj.weight", 0)]
    return {"in_chans": s.dim("patch_embed.proj.weight", 1), "out_chans": s.dim("patch_unembed.proj.0.weight", 0),
            "embed_dims": [*dims, dims[1], dims[0]], "depths": [s.count(f"layer{i}.blocks.") for i in range(1, 6)]}


register_recogniser("MixDehazeNet", _recognise)
