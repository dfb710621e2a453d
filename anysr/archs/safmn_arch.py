"""SAFMN: Spatially-Adaptive Feature Modulation Network for efficient SR (Sun et al., ICCV 2023).

Module names and constructor arguments follow the authors' code (as in spandrel 0.4.2), so released
checkpoints load with ``strict=True`` and give the same output.

Each block modulates the features with a four-level pyramid (adaptive max-pooling to 1/2, 1/4, 1/8 of the
size, a depth-wise conv per level, nearest upsampling back). Any input of at least 8 pixels per side runs
as the authors' code runs it (no padding; their benchmarks use the LR images as they are); smaller inputs
are grown to 8 by reflect / edge padding and the output cropped. ``tile_multiple`` is 8: tiles of a
multiple of 8 pool exactly as the training crops do (spandrel's size requirement).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, nearest_upsample, pad_to_min_size
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

N_LEVELS = 4


class CCM(nn.Module):
    """Convolutional channel mixer: 3x3 conv to ``growth_rate`` x channels, GELU, 1x1 conv back."""

    def __init__(self, dim: int, growth_rate: float = 2.0) -> None:
        super().__init__()
        hidden = int(dim * growth_rate)
        self.ccm = nn.Sequential(nn.Conv2d(dim, hidden, 3, 1, 1), nn.GELU(), nn.Conv2d(hidden, dim, 1, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ccm(x)


class SAFM(nn.Module):
    """Spatially-adaptive feature modulation: the channels are split into ``n_levels`` chunks; chunk ``i``
    is max-pooled to 1/2**i of the size, filtered depth-wise and upsampled back; a 1x1 conv aggregates them
    and ``gelu(aggregate)`` modulates the input."""

    def __init__(self, dim: int, n_levels: int = N_LEVELS) -> None:
        super().__init__()
        self.n_levels = n_levels
        chunk = dim // n_levels
        self.mfr = nn.ModuleList([nn.Conv2d(chunk, chunk, 3, 1, 1, groups=chunk) for _ in range(n_levels)])
        self.aggr = nn.Conv2d(dim, dim, 1, 1, 0)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        parts = []
        for i, chunk in enumerate(x.chunk(self.n_levels, dim=1)):
            if i == 0:
                parts.append(self.mfr[0](chunk))
                continue
            f = 2**i
            if h % f == 0 and w % f == 0:
                # The same bins as adaptive pooling as a plain pool, and nearest upsampling by f (XLA-friendly).
                up = nearest_upsample(self.mfr[i](F.max_pool2d(chunk, f)), f)
            else:
                pooled = F.adaptive_max_pool2d(chunk, (h // f, w // f))
                up = F.interpolate(self.mfr[i](pooled), size=(h, w), mode="nearest")
            parts.append(up)
        return self.act(self.aggr(torch.cat(parts, dim=1))) * x


class AttBlock(nn.Module):
    """``x + SAFM(norm1(x))``, then ``+ CCM(norm2(.))``."""

    def __init__(self, dim: int, ffn_scale: float = 2.0) -> None:
        super().__init__()
        self.norm1 = LayerNorm2d(dim)
        self.norm2 = LayerNorm2d(dim)
        self.safm = SAFM(dim)
        self.ccm = CCM(dim, ffn_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.safm(self.norm1(x)) + x
        return self.ccm(self.norm2(x)) + x


@ARCH_REGISTRY.register()
class SAFMN(nn.Module):
    """SAFMN: 3x3 conv, ``n_blocks`` AttBlocks with a long shortcut, 3x3 conv + PixelShuffle. RGB in and out.

    Args:
        dim: width (a multiple of 4; 36 for SAFMN, 128 for SAFMN-L). n_blocks: blocks (8; 16 for SAFMN-L).
        ffn_scale: hidden width factor of the channel mixer. upscaling_factor: integer scale >= 1.
    """

    tile_multiple: int = 2 ** (N_LEVELS - 1)

    def __init__(self, dim: int, n_blocks: int = 8, ffn_scale: float = 2.0, upscaling_factor: int = 4) -> None:
        super().__init__()
        s = upscaling_factor
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ArchArgumentError("upscaling_factor", f"SAFMN needs an integer upscaling_factor >= 1, got {s!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < N_LEVELS or dim % N_LEVELS:
            raise ArchArgumentError("dim", f"SAFMN needs dim to be a multiple of {N_LEVELS} (one chunk per pyramid "
                                    f"level), got {dim!r}")
        self.upscale = s
        self.to_feat = nn.Conv2d(3, dim, 3, 1, 1)
        self.feats = nn.Sequential(*[AttBlock(dim, ffn_scale) for _ in range(n_blocks)])
        self.to_img = nn.Sequential(nn.Conv2d(dim, 3 * s**2, 3, 1, 1), nn.PixelShuffle(s))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, self.tile_multiple)
        feat = self.to_feat(x)
        out = self.to_img(self.feats(feat) + feat)
        return out[..., : h * self.upscale, : w * self.upscale]


__all__ = ["SAFMN", "SAFM", "AttBlock"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SAFMN", scale_arg="upscaling_factor", presets={
    "safmn": {"dim": 36},  # 0.24 M parameters at x4
    "safmn_l": {"dim": 128, "n_blocks": 16},  # 5.60 M parameters at x4
})


def ffn_scales(hidden: int, dim: int) -> list[float]:
    """The channel mixer's ``ffn_scale`` candidates for a hidden width (``int(dim * ffn_scale) == hidden``):
    the exact ratio, and one half a channel above it when rounding makes the ratio fall short."""
    return [hidden / dim, (hidden + 0.5) / dim]


def _recognise(s: StateShapes) -> list[dict]:
    """SAFMN from its tensors: width from the first conv, depth from the blocks, the mixer's hidden width from
    the first block, the scale from the last conv's PixelShuffle width (RGB)."""
    dim = s.dim("to_feat.weight", 0)
    scale = [sc for c, sc in shuffle_splits(s.dim("to_img.0.weight", 0), (3,))]
    hidden = s.dim("feats.0.ccm.ccm.0.weight", 0) if "feats.0.ccm.ccm.0.weight" in s else 2 * dim
    return [{"dim": dim, "n_blocks": s.count("feats."), "ffn_scale": f, "upscaling_factor": sc}
            for sc in scale for f in ffn_scales(hidden, dim)]


register_recogniser("SAFMN", _recognise)
