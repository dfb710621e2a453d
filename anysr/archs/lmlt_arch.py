"""LMLT: Low-to-high Multi-Level Vision Transformer for image super-resolution (Kim & Kim, 2024, arXiv 2409.03516).

Module names and constructor arguments follow traiNNer-redux's ``LMLT``, so its checkpoints (LMLT-Tiny / Base /
Large) load with ``strict=True`` and give the same output. Each block splits the (layer-normed) channels into four
parts, max-pools part ``i`` to 1/2**i of the size and runs single-head 8x8 window attention on it (with a
depth-wise conv positional term on the values), from the coarsest level up: each level's result, upsampled x2,
is added to the next finer level's input; all four are upsampled to full size, fused by a 1x1 conv and, through
GELU, modulate the block's input; a conv channel mixer follows. A 3x3 stem and a conv + PixelShuffle head.

Size requirement: the coarsest level must hold whole windows, so the input is reflect-padded inside forward to a
multiple of 64 (8x8 windows at 1/8 size) and the output cropped, as the original does; ``tile_multiple = 64``.
Attention runs through ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, nearest_upsample, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

WINDOW = 8
N_LEVELS = 4


class CCM(nn.Module):
    """Convolutional channel mixer: 3x3 conv to ``growth_rate`` x channels, GELU, 1x1 conv back."""

    def __init__(self, dim: int, growth_rate: float = 2.0) -> None:
        super().__init__()
        hidden = int(dim * growth_rate)
        self.ccm = nn.Sequential(nn.Conv2d(dim, hidden, 3, 1, 1), nn.GELU(), nn.Conv2d(hidden, dim, 1, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ccm(x)


class DownsampleViT(nn.Module):
    """Single-head attention within non-overlapping ``window_size`` windows of an NCHW map; the values also go
    through a depth-wise 3x3 conv inside each window (``get_v``, the positional term added to the output).
    ``down_scale`` is accepted for the original signature (the pooling happens in the caller)."""

    def __init__(self, dim: int, window_size: int = WINDOW, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 down_scale: int = 2) -> None:
        super().__init__()
        del down_scale
        self.dim = dim
        self.window_size = window_size
        self.scale = dim**-0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.get_v = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        ws = self.window_size
        nh, nw = h // ws, w // ws
        # (b, c, h, w) -> (b * nh * nw, ws * ws, c): windows in row-major order, pixels row-major inside
        tokens = x.reshape(b, c, nh, ws, nw, ws).permute(0, 2, 4, 3, 5, 1).reshape(-1, ws * ws, c)
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        v_map = v.transpose(1, 2).reshape(-1, c, ws, ws)
        lepe = self.get_v(v_map).flatten(2).transpose(1, 2)
        drop = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, scale=self.scale) + lepe
        out = self.proj_drop(self.proj(out))
        return out.reshape(b, nh, nw, ws, ws, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w)


def _pool(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Max-pool to ``1/factor`` of the size (adaptive bins where the size does not divide)."""
    h, w = x.shape[-2:]
    if h % factor == 0 and w % factor == 0:
        return F.max_pool2d(x, factor)
    return F.adaptive_max_pool2d(x, (h // factor, w // factor))


def _nearest_up(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest upsampling to ``size``: an integer factor as a broadcast (whose gradient is a plain sum, where
    XLA has no lowering of ``upsample_nearest2d``'s backward), other sizes through ``F.interpolate``."""
    b, c, h, w = x.shape
    fh, fw = size[0] // h, size[1] // w
    if (h * fh, w * fw) != tuple(size):
        return F.interpolate(x, size=size, mode="nearest")
    if fh == fw:
        return nearest_upsample(x, fh)
    return x.reshape(b, c, h, 1, w, 1).expand(b, c, h, fh, w, fw).reshape(b, c, h * fh, w * fw)


class LHSB(nn.Module):
    """Low-to-high multi-level attention: ``n_levels`` channel parts, part ``i`` at 1/2**i of the size, coarse
    levels feeding finer ones; ``gelu(aggr(levels)) * x``."""

    def __init__(self, dim: int, attn_drop: float = 0.0, proj_drop: float = 0.0, n_levels: int = N_LEVELS) -> None:
        super().__init__()
        self.n_levels = n_levels
        self.mfr = nn.ModuleList([DownsampleViT(dim // n_levels, WINDOW, attn_drop, proj_drop, 2**i)
                                  for i in range(n_levels)])
        self.aggr = nn.Conv2d(dim, dim, 1, 1, 0)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        parts = list(x.chunk(self.n_levels, dim=1))
        levels = [parts[0]] + [_pool(parts[i], 2**i) for i in range(1, self.n_levels)]
        outs = []  # coarsest first: the 1x1 aggregation's channel order
        carry = None
        for i in reversed(range(self.n_levels)):
            inp = levels[i] if carry is None else levels[i] + carry
            s = self.mfr[i](inp)
            carry = _nearest_up(s, (s.shape[2] * 2, s.shape[3] * 2))
            outs.append(_nearest_up(s, (h, w)) if i else s)
        return self.act(self.aggr(torch.cat(outs, dim=1))) * x


class AttBlock(nn.Module):
    """``x + LHSB(norm1(x))``, then ``+ CCM(norm2(.))``. ``drop_path`` is accepted and unused, as in the original."""

    def __init__(self, dim: int, ffn_scale: float = 2.0, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        del drop_path
        self.norm1 = LayerNorm2d(dim)
        self.norm2 = LayerNorm2d(dim)
        self.lhsb = LHSB(dim, attn_drop=attn_drop, proj_drop=drop)
        self.ccm = CCM(dim, ffn_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lhsb(self.norm1(x)) + x
        return self.ccm(self.norm2(x)) + x


@ARCH_REGISTRY.register()
class LMLT(nn.Module):
    """LMLT. Args: dim: width, a multiple of 4 (36 tiny, 60 base, 84 large). n_blocks: blocks. ffn_scale: channel
    mixer width factor. scale: integer >= 1. drop_rate / attn_drop_rate: dropout after the attention projection /
    on the attention weights (training only). drop_path_rate: accepted, unused (as in the original)."""

    tile_multiple: int = WINDOW * 2 ** (N_LEVELS - 1)

    def __init__(self, dim: int, n_blocks: int = 8, ffn_scale: float = 2.0, scale: int = 4, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"LMLT needs an integer scale >= 1, got {scale!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < N_LEVELS or dim % N_LEVELS:
            raise ArchArgumentError("dim", f"LMLT needs dim to be a multiple of {N_LEVELS} (one part per level), "
                                    f"got {dim!r}")
        del drop_path_rate
        self.scale = scale
        self.window_size = WINDOW
        self.to_feat = nn.Conv2d(3, dim, 3, 1, 1)
        self.feats = nn.Sequential(*[AttBlock(dim, ffn_scale, drop=drop_rate, attn_drop=attn_drop_rate)
                                     for _ in range(n_blocks)])
        self.to_img = nn.Sequential(nn.Conv2d(dim, 3 * scale**2, 3, 1, 1), nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        feat = self.to_feat(pad_to_multiple(x, self.tile_multiple)[0])
        feat = (self.feats(feat) + feat)[..., :h, :w]
        return self.to_img(feat)


__all__ = ["LMLT", "LHSB", "DownsampleViT", "AttBlock"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("LMLT", scale_arg="scale", presets={
    "lmlt_tiny": {"dim": 36},  # 0.25 M parameters at x4
    "lmlt_base": {"dim": 60},  # 0.67 M
    "lmlt_large": {"dim": 84},  # 1.30 M
})

# neosr's ``lmlt`` (its class, with a default width; tests/test_neosr_names.py checks it against neosr's network)
register_presets("LMLT", scale_arg="scale", renames={"upscaling_factor": "scale"}, fixed={"window_size": WINDOW},
                 source="neosr", presets={
    "lmlt": {"dim": 60},  # 0.67 M parameters at x4
})


def _recognise(s: StateShapes) -> dict:
    """LMLT from its tensors: width from the stem, depth from the blocks, the channel mixer's factor from its
    hidden width, the scale from the output conv (RGB x scale**2)."""
    dim = s.dim("to_feat.weight", 0)
    return {"dim": dim, "n_blocks": s.count("feats."), "ffn_scale": s.dim("feats.0.ccm.ccm.0.weight", 0) / dim,
            "scale": round((s.dim("to_img.0.weight", 0) // 3) ** 0.5)}


register_recogniser("LMLT", _recognise)
