"""Light-SAFMN++: the lightweight spatially-adaptive feature modulation network of the NTIRE 2024 efficient SR
entry (SAFMN++, Sun et al.), as neosr trains it (``light_safmnpp``).

Module names and constructor arguments follow neosr's ``light_safmnpp`` (``safmn_arch.py``), so its checkpoints
load with ``strict=True`` and give the same output. A bias-free 3x3 conv, ``n_blocks`` blocks, a long skip and a
conv + PixelShuffle head (no biases anywhere). A block: a simplified modulation (3x3 conv; half the channels
max-pooled to an eighth of the size, a 3x3 depth-wise conv, bilinear back, GELU, times the other half's twin;
GELU and a 1x1 conv over both halves), then a conv mixer (3x3 conv to ``ffn_scale`` x the width, GELU, 1x1 back).
Neither is residual by itself.

The pooling is adaptive (``adaptive_max_pool2d`` to ``(h // 8, w // 8)``), computed here as gathers over index
windows built from the input's size, so any size of at least 8 pixels exports to ONNX with dynamic sizes and
runs on XLA; smaller inputs are grown to 8 (reflect, then edge) and the output cropped back (neosr's fails there).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_min_size
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.archs.resize_util import adaptive_max_gather, resize_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

POOL = 8  # the modulation pools to an eighth of each side
_TAPS = 17  # the widest window an adaptive pool to n // 8 cells can have (below 16 pixels), plus one


class SimpleSAFM(nn.Module):
    """Simplified spatially-adaptive feature modulation (see the module docstring)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, 3, 1, 1, bias=False)
        self.dwconv = nn.Conv2d(dim // 2, dim // 2, 3, 1, 1, groups=dim // 2, bias=False)
        self.out = nn.Conv2d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x0, x1 = self.proj(x).chunk(2, dim=1)
        pooled = adaptive_max_gather(adaptive_max_gather(x0, 2, h // POOL, _TAPS), 3, w // POOL, _TAPS)
        mod = F.gelu(resize_bilinear(self.dwconv(pooled), (h, w), align_corners=False)) * x0
        return self.out(F.gelu(torch.cat([x1, mod], dim=1)))


class CCMLight(nn.Module):
    """Bias-free 3x3 conv to ``int(dim * ffn_scale)`` channels, GELU, 1x1 conv back (``conv``)."""

    def __init__(self, dim: int, ffn_scale: float) -> None:
        super().__init__()
        hidden = int(dim * ffn_scale)
        self.conv = nn.Sequential(nn.Conv2d(dim, hidden, 3, 1, 1, bias=False), nn.GELU(),
                                  nn.Conv2d(hidden, dim, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class AttBlockPP(nn.Module):
    """``conv2(conv1(x))``: the modulation, then the mixer."""

    def __init__(self, dim: int, ffn_scale: float) -> None:
        super().__init__()
        self.conv1 = SimpleSAFM(dim)
        self.conv2 = CCMLight(dim, ffn_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


@ARCH_REGISTRY.register()
class LightSAFMNPP(nn.Module):
    """Light-SAFMN++ (neosr's ``light_safmnpp``).

    Args:
        dim: width (even). n_blocks: blocks. ffn_scale: the mixer's expansion. upscaling_factor: scale.
    """

    min_size = POOL

    def __init__(self, dim: int = 32, n_blocks: int = 2, ffn_scale: float = 1.5, upscaling_factor: int = 4) -> None:
        super().__init__()
        if isinstance(upscaling_factor, bool) or not isinstance(upscaling_factor, int) or upscaling_factor < 1:
            raise ArchArgumentError("upscaling_factor", f"LightSAFMNPP needs an integer upscaling_factor >= 1, got "
                                                        f"{upscaling_factor!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ArchArgumentError("dim", f"LightSAFMNPP needs an even integer dim >= 2, got {dim!r}")
        if isinstance(n_blocks, bool) or not isinstance(n_blocks, int) or n_blocks < 0:
            raise ArchArgumentError("n_blocks", f"LightSAFMNPP needs an integer n_blocks >= 0, got {n_blocks!r}")
        if int(dim * ffn_scale) < 1:
            raise ArchArgumentError("ffn_scale", f"LightSAFMNPP: dim * ffn_scale must be at least 1, got "
                                                 f"{dim} * {ffn_scale!r}")
        self.scale = upscaling_factor
        self.to_feat = nn.Conv2d(3, dim, 3, 1, 1, bias=False)
        self.feats = nn.Sequential(*(AttBlockPP(dim, ffn_scale) for _ in range(n_blocks)))
        self.to_img = nn.Sequential(nn.Conv2d(dim, 3 * upscaling_factor**2, 3, 1, 1, bias=False),
                                    nn.PixelShuffle(upscaling_factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = self.to_feat(pad_to_min_size(x, POOL))
        out = self.to_img(self.feats(x) + x)
        return out[:, :, :h * self.scale, :w * self.scale]


__all__ = ["AttBlockPP", "CCMLight", "LightSAFMNPP", "SimpleSAFM"]


# neosr's name (its class, with its defaults; the scale comes from the options file)
register_presets("LightSAFMNPP", scale_arg="upscaling_factor", source="neosr", presets={
    "light_safmnpp": {},  # 66,176 parameters at x4
})


def _recognise(s: StateShapes) -> list[dict] | None:
    """Light-SAFMN++ from its tensors: width from the bias-free stem (no other family has ``to_feat`` without a bias
    and blocks with ``conv1.dwconv``), depth, the mixer's expansion, the scale from the RGB head."""
    if "to_feat.weight" not in s or "to_feat.bias" in s or "to_img.0.weight" not in s:
        return None
    n_blocks = s.count("feats.")
    if n_blocks and "feats.0.conv1.dwconv.weight" not in s:
        return None
    dim = s.dim("to_feat.weight", 0)
    args: dict = {"dim": dim, "n_blocks": n_blocks}
    if n_blocks:
        args["ffn_scale"] = width_ratio(s.dim("feats.0.conv2.conv.0.weight", 0), dim, 1.5)
    return [{**args, "upscaling_factor": sc} for c, sc in shuffle_splits(s.dim("to_img.0.weight", 0), (3,))
            if c == 3]


register_recogniser("LightSAFMNPP", _recognise)
