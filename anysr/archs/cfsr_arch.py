"""CFSR: convolutional feature-modulation SR (Wu et al., "Transforming Image Super-Resolution: A ConvFormer-based
Efficient Approach", 2024), as neosr trains it.

Module names and constructor arguments follow neosr's ``cfsr`` (``cfsr_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. A 3x3 conv, ``len(depths)`` layers of ConvFormer blocks (each followed by
a 1x1 conv with a shortcut), a channel layer norm, a 3x3 conv with a long skip and a one-step PixelShuffle head.

A block: ``x + ls1 * ConvMod(x)``, then ``x + ls2 * MLP(x)``. ConvMod: layer norm, ``a = dw_k(gelu(1x1(x)))``
(a depth-wise ``dw_size`` conv), ``proj(a * v(x))``. MLP: layer norm, 1x1 up by ``mlp_ratio``, GELU,
``y + gelu(dw3x3(y))``, 1x1 down. neosr builds its MLP with three fixed edge filters (Sobel x / y, Laplacian) beside
the depth-wise 3x3 and folds them into it when the network is built (before initialisation), so a network never
holds them: here the MLP is the folded form. Any input size; no padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

RGB_MEAN = (0.4488, 0.4371, 0.4040)  # DIV2K's, used when mean_norm is set


class LargeKernelConv(nn.Module):
    """A depth-wise ``k x k`` conv (neosr's re-parameterised form: parameters under ``lkb_reparam``)."""

    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.lkb_reparam = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lkb_reparam(x)


class ConvMod(nn.Module):
    """Convolutional modulation: ``proj(dw_k(gelu(1x1(n))) * v(n))`` with ``n = norm(x)``."""

    def __init__(self, dim: int, dw_size: int) -> None:
        super().__init__()
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.a = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), LargeKernelConv(dim, dw_size))
        self.v = nn.Conv2d(dim, dim, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.proj(self.a(x) * self.v(x))


class MLP(nn.Module):
    """Layer norm, 1x1 up, GELU, ``y + gelu(dw3x3(y))`` (the edge filters folded into ``pos``), 1x1 down."""

    def __init__(self, dim: int, mlp_ratio: int) -> None:
        super().__init__()
        hidden = dim * mlp_ratio
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.pos = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.fc1(self.norm(x)))
        return self.fc2(y + F.gelu(self.pos(y)))


class Block(nn.Module):
    """``x + ls1 * attn(x)``, then ``+ ls2 * mlp(.)`` (per-channel layer scales, initially 1e-6)."""

    def __init__(self, dim: int, dw_size: int, mlp_ratio: int) -> None:
        super().__init__()
        self.attn = ConvMod(dim, dw_size)
        self.mlp = MLP(dim, mlp_ratio)
        self.layer_scale_1 = nn.Parameter(torch.full((dim,), 1e-6))
        self.layer_scale_2 = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.layer_scale_1.view(-1, 1, 1) * self.attn(x)
        return x + self.layer_scale_2.view(-1, 1, 1) * self.mlp(x)


class Layer(nn.Module):
    """``depth`` blocks, then ``conv1x1(y) + y``."""

    def __init__(self, dim: int, depth: int, dw_size: int, mlp_ratio: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim, dw_size, mlp_ratio) for _ in range(depth)])
        self.conv = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.conv(x) + x


@ARCH_REGISTRY.register()
class CFSR(nn.Module):
    """CFSR (neosr's ``cfsr``); the defaults are the published network.

    Args (neosr's): in_chans (image channels), embed_dim (width), depths (blocks per layer), dw_size (the
    modulation's depth-wise kernel, odd), mlp_ratio (the MLP's expansion, truncated to an integer), upscale,
    img_range and mean_norm (subtract DIV2K's RGB mean (0 for gray) and scale by ``img_range`` around the
    network), upsampler ('pixelshuffledirect': conv + PixelShuffle; anything else: ``x + conv_last(.)``, a
    same-size restoration network whatever ``upscale`` says).
    """

    def __init__(self, in_chans: int = 3, embed_dim: int = 48, depths: Sequence[int] = (6, 6), dw_size: int = 9,
                 mlp_ratio: float = 2.0, upscale: int = 4, img_range: float = 1.0,
                 upsampler: str = "pixelshuffledirect", mean_norm: bool = False) -> None:
        super().__init__()
        for name, value in (("in_chans", in_chans), ("embed_dim", embed_dim), ("dw_size", dw_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArchArgumentError(name, f"CFSR needs an integer {name} >= 1, got {value!r}")
        if dw_size % 2 == 0:
            raise ArchArgumentError("dw_size", f"CFSR needs an odd dw_size (the kernel keeps the size), got {dw_size}")
        if isinstance(depths, (str, bytes)) or not isinstance(depths, Sequence) or not depths or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in depths):
            raise ArchArgumentError("depths", f"CFSR needs a non-empty list of block counts >= 0, got {depths!r}")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or int(mlp_ratio) < 1:
            raise ArchArgumentError("mlp_ratio", f"CFSR needs mlp_ratio >= 1, got {mlp_ratio!r}")
        if not isinstance(upsampler, str):
            raise ArchArgumentError("upsampler", f"CFSR's upsampler is a string, got {upsampler!r}")
        direct = upsampler == "pixelshuffledirect"
        if direct and (isinstance(upscale, bool) or not isinstance(upscale, int) or upscale < 1):
            raise ArchArgumentError("upscale", f"CFSR needs an integer upscale >= 1, got {upscale!r}")
        if mean_norm and in_chans not in (1, 3):
            raise ArchArgumentError("mean_norm", f"CFSR has a mean for 3 or 1 image channels only, got {in_chans}")
        self.img_range = float(img_range)
        self.mean_norm = bool(mean_norm)
        self.upscale = upscale if direct else 1
        self.upsampler = upsampler
        self.in_channels = in_chans
        mean = torch.tensor(RGB_MEAN if in_chans == 3 else (0.0,) * in_chans).view(1, -1, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)
        self.layers = nn.ModuleList([Layer(embed_dim, d, dw_size, int(mlp_ratio)) for d in depths])
        self.norm = LayerNorm2d(embed_dim, eps=1e-6)
        self.conv_after_body = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1)
        if direct:
            self.upsample = nn.Sequential(nn.Conv2d(embed_dim, upscale**2 * in_chans, 3, 1, 1),
                                          nn.PixelShuffle(upscale))
        else:
            self.conv_last = nn.Conv2d(embed_dim, in_chans, 3, 1, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The layers and the closing layer norm."""
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(x.dtype)
        if self.mean_norm:
            x = (x - mean) * self.img_range
        feat = self.conv_first(x)
        res = self.conv_after_body(self.forward_features(feat)) + feat
        x = self.upsample(res) if self.upsampler == "pixelshuffledirect" else x + self.conv_last(res)
        if self.mean_norm:
            x = x / self.img_range + mean
        return x


__all__ = ["CFSR"]


def _recognise(s: StateShapes) -> list[dict] | None:
    """CFSR from its tensors: width and image channels from ``conv_first``, the blocks of each layer, the
    modulation kernel and MLP ratio from the first block, the head (``upsample.0``: scale; ``conv_last``: none)."""
    embed_dim, in_chans = s.shape("conv_first.weight")[:2]
    layers = s.indices("layers.")
    depths = [s.count(f"layers.{i}.blocks.") for i in layers]
    if not layers or f"layers.{layers[0]}.conv.weight" not in s or "norm.weight" not in s:
        return None
    args: dict = {"in_chans": in_chans, "embed_dim": embed_dim, "depths": depths}
    first = next((i for i, d in zip(layers, depths, strict=True) if d), None)
    if first is not None:
        args["dw_size"] = s.dim(f"layers.{first}.blocks.0.attn.a.2.lkb_reparam.weight", -1)
        hidden = s.dim(f"layers.{first}.blocks.0.mlp.fc1.weight", 0)
        if hidden % embed_dim:
            raise NotThisFamily("MLP width")
        args["mlp_ratio"] = float(hidden // embed_dim)
    if "conv_last.weight" in s:
        return [{**args, "upsampler": "", "upscale": 1}]
    return [{**args, "upscale": sc} for c, sc in shuffle_splits(s.dim("upsample.0.weight", 0), (in_chans,))
            if c == in_chans]


register_recogniser("CFSR", _recognise)
# neosr's name: the class defaults (neosr's), the option file's top-level scale
register_presets("CFSR", scale_arg="upscale", source="neosr", presets={"cfsr": {}})
