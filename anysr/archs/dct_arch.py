"""DCT: Dual Compression Transformer (neosr's ``dct``), a DAT-like lightweight SR transformer.

Residual groups of blocks in pairs. The first block of a pair splits the (normed) channels in halves: one half
runs spatial window attention (DAT's: two channel quarters in ``split_size`` windows and their transpose, shifted
in DAT's pattern of blocks, with a dynamic position bias), the other half a linear attention (L2-normalised
queries / keys, ``0.5 v + q (k^T v) / pi`` normalised, plus a depth-wise conv of ``v`` along the token sequence).
The second block of a pair does not attend: it compresses the first block's attention output with 1x1 / 3x3
convs gated by an ECA-style channel attention (and, as neosr's code does, continues from its normed input). Every
block ends with DAT's spatial-gate feed-forward network. Constructor arguments and state-dict keys are neosr's,
so its weights load strictly and give its outputs.

Any height / width: the window attention zero-pads its queries / keys / values to a multiple of both window
sides inside each block and crops back (neosr pads to the larger side, the same where one side divides the
other, the only windows neosr runs); the shifted blocks' masks are computed for the actual size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    SwinSRBase,
    drop_path_rates,
    residual_conv,
    to_2tuple,
    to_feature_map,
    to_tokens,
)
from anysr.archs.dat_arch import SGFN, ShiftedWindowPair, _ToTokens, check_window_groups
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import (
    PUBLISHED_IMG_SIZE,
    NotThisFamily,
    clean,
    reconstruction,
    resi_connection,
    square_side,
    window_pair,
)
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect")


class Adaptive_Window_Attention(ShiftedWindowPair):  # noqa: N801 - neosr's class name
    """DAT's spatial window attention without its conv interaction: q/k/v, two channel halves in a window and the
    transposed window (shifted where DAT shifts), a projection."""

    family = "DCT"


class Linear_Attention(nn.Module):  # noqa: N801 - neosr's class name
    """Linear attention: L2-normalised q / k, ``0.5 v + q (k^T v) / pi`` L2-normalised per token, plus a
    depth-wise ``res_kernel_size x 1`` conv of ``v`` along the token sequence (one channel per head)."""

    def __init__(self, in_channels: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, res_kernel_size: int = 9) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(in_channels, in_channels * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)  # unused by the math, as in neosr (kept for its module tree)
        self.proj = nn.Linear(in_channels, in_channels)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dconv = nn.Conv2d(num_heads, num_heads, kernel_size=(res_kernel_size, 1),
                               padding=(res_kernel_size // 2, 0), bias=False, groups=num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
        y = 0.5 * v + (q @ (k.transpose(-2, -1) @ v)) / math.pi
        y = y / y.norm(dim=-1, keepdim=True) + self.dconv(v)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(b, n, c)))


class DCTB(nn.Module):
    """A DCT block: attention (even ``b_idx``: window attention on one half, linear attention on the other) or
    compression of the previous block's attention output (odd), then DAT's spatial-gate FFN."""

    def __init__(self, dim: int, num_heads: int, reso: int = 64, split_size: Sequence[int] = (2, 4),
                 shift_size: Sequence[int] = (1, 2), expansion_factor: float = 4.0, qkv_bias: bool = False,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm,
                 rg_idx: int = 0, b_idx: int = 0) -> None:
        super().__init__()
        self.attends = b_idx % 2 == 0
        self.norm1 = norm_layer(dim // 2)
        if self.attends:
            self.swsa = Adaptive_Window_Attention(dim // 2, num_heads=num_heads // 2, reso=reso, split_size=split_size,
                                                  shift_size=shift_size, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                                  drop=drop, attn_drop=attn_drop, rg_idx=rg_idx, b_idx=b_idx)
            self.lla = Linear_Attention(dim // 2, num_heads=num_heads // 2)
        else:
            self.fc1 = nn.Conv2d(dim, dim // 4, kernel_size=1)
            self.dwc = nn.Conv2d(dim // 4, dim // 4, kernel_size=3, stride=1, padding=1)
            self.fc2 = nn.Conv2d(dim // 4, dim, kernel_size=1)
            self.eca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dim, dim // 16, 1), nn.ReLU(inplace=True),
                                     nn.Conv2d(dim // 16, dim, 1), nn.Sigmoid())
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.ffn = SGFN(dim, int(dim * expansion_factor), dim, act_layer=act_layer)
        self.norm2 = norm_layer(dim)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int],
                prev_attention: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (b, h*w, c) -> (x, this block's attention / compression output)."""
        h, w = x_size
        half = x.shape[-1] // 2
        a, c = self.norm1(x[..., :half]), self.norm1(x[..., half:])
        if self.attends:
            out = torch.cat([self.swsa(a, h, w), self.lla(c)], dim=-1)
        else:
            if prev_attention is None:
                raise ValueError("DCT: a compression block needs the previous (attention) block's output")
            x = torch.cat([a, c], dim=-1)  # neosr's compression block continues from its normed input
            y = self.fc2(F.gelu(self.dwc(self.fc1(to_feature_map(prev_attention, h, w)))))
            out = to_tokens(y * self.eca(y))
        x = x + self.drop_path(out)
        return x + self.drop_path(self.ffn(self.norm2(x), h, w)), out


class ResidualGroup(nn.Module):
    """``depth`` DCTBs (pairs: attention, compression), a conv on the feature map ('1conv' / '3conv'), a shortcut."""

    def __init__(self, dim: int, reso: int, num_heads: int, split_size: Sequence[int] = (2, 4),
                 expansion_factor: float = 4.0, qkv_bias: bool = False, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_paths: Sequence[float] | None = None,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm, depth: int = 2,
                 resi_connection: str = "1conv", rg_idx: int = 0) -> None:
        super().__init__()
        self.reso = reso
        rates = list(drop_paths) if drop_paths is not None else [0.0] * depth
        self.blocks = nn.ModuleList([
            DCTB(dim, num_heads, reso=reso, split_size=split_size, shift_size=(split_size[0] // 2, split_size[1] // 2),
                 expansion_factor=expansion_factor, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                 attn_drop=attn_drop, drop_path=rates[i], act_layer=act_layer, norm_layer=norm_layer,
                 rg_idx=rg_idx, b_idx=i)
            for i in range(depth)
        ])
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        res = x
        prev: torch.Tensor | None = None
        for blk in self.blocks:
            x, out = blk(x, x_size, prev)
            prev = out if blk.attends else None
        return res + to_tokens(self.conv(to_feature_map(x, *x_size)))


@ARCH_REGISTRY.register()
class DCT(SwinSRBase):
    """Dual Compression Transformer (neosr's ``dct``; its arguments and defaults).

    Args: img_size (training patch size; only sizes the kept mask buffers), in_chans, embed_dim (a multiple of 64:
    the position-bias MLP is embed_dim/64 wide), split_size (window height, width), depth (blocks per residual
    group), num_heads (one per group; a multiple of 4: a quarter per window branch), expansion_factor (SGFN width),
    qkv_bias (window attention), qk_scale, drop_rate, attn_drop_rate, drop_path_rate, act_layer, norm_layer,
    upscale (1, 2**n or 3), img_range, resi_connection ('1conv' or '3conv'), upsampler ('pixelshuffle' or
    'pixelshuffledirect'). RGB inputs are shifted by 0.5 (neosr's mean).
    """

    swin_init_norms = (nn.LayerNorm,)
    no_weight_decay_names = frozenset()
    no_weight_decay_fragments = frozenset()
    pads_input = False  # the window attention pads inside each block

    def __init__(self, img_size: int = 64, in_chans: int = 3, embed_dim: int = 80, split_size: Sequence[int] = (2, 4),
                 depth: Sequence[int] = (20,), num_heads: Sequence[int] = (8,), expansion_factor: float = 4.0,
                 qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm, upscale: int = 4, img_range: float = 1.0,
                 resi_connection: str = "3conv", upsampler: str = "pixelshuffledirect") -> None:
        super().__init__()
        split_size = list(to_2tuple(split_size))
        _check_args(embed_dim, split_size, depth, num_heads, upscale, resi_connection, upsampler)
        self.split_size = split_size
        self.tile_multiple: int = math.lcm(split_size[0], split_size[1])
        self.init_shallow(in_chans, embed_dim, len(depth), img_range, upscale, upsampler, (0.5, 0.5, 0.5))
        self.before_RG = nn.Sequential(_ToTokens(), nn.LayerNorm(embed_dim))
        rates = drop_path_rates(drop_path_rate, sum(depth))
        self.layers = nn.ModuleList()
        for i, blocks in enumerate(depth):
            start = sum(depth[:i])
            self.layers.append(ResidualGroup(embed_dim, img_size, num_heads[i], split_size=split_size,
                                             expansion_factor=expansion_factor, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                             drop=drop_rate, attn_drop=attn_drop_rate,
                                             drop_paths=rates[start:start + blocks], act_layer=act_layer,
                                             norm_layer=norm_layer, depth=blocks, resi_connection=resi_connection,
                                             rg_idx=i))
        self.norm = norm_layer(embed_dim)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale, (img_size, img_size))
        self.init_swin_weights()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The residual groups on a (b, embed_dim, h, w) map of any size."""
        h, w = x.shape[2], x.shape[3]
        x = self.before_RG(x)
        for layer in self.layers:
            x = layer(x, (h, w))
        return to_feature_map(self.norm(x), h, w)


def _check_args(embed_dim: int, split_size: Sequence[int], depth: Sequence[int], num_heads: Sequence[int],
                upscale: int, resi_connection: str, upsampler: str) -> None:
    """Refuse arguments neosr's DCT cannot run (it would fail later, or build no head)."""
    check_window_groups("DCT", split_size, depth, num_heads, upscale, resi_connection, upsampler,
                        UPSAMPLERS)
    if embed_dim < 64 or embed_dim % 16:
        raise ArchArgumentError("embed_dim", f"DCT: embed_dim must be a multiple of 16 and at least 64 "
                                f"(position-bias MLP width embed_dim/64), got {embed_dim}")
    for heads in num_heads:
        if heads < 4 or heads % 4 or (embed_dim // 4) % (heads // 4):
            raise ArchArgumentError("num_heads", f"DCT: each head count must be a multiple of 4 (a quarter per "
                                    f"window branch) dividing embed_dim {embed_dim} into quarters; got {heads}")


def _recognise(s: StateShapes) -> list[dict]:
    """DCT from its tensors: width and channels from the first conv, blocks per group, heads (twice the linear
    attention's), the window from the first window branch's index and bias rows, ``img_size`` from a shifted
    block's mask, the expansion factor, switches, the reconstruction."""
    branch = "layers.0.blocks.0.swsa.attns.0"
    if "before_RG.1.weight" not in s or f"{branch}.relative_position_index" not in s:
        return []
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    groups = s.indices("layers.")
    split = window_pair(s.dim(f"{branch}.relative_position_index", 0), s.dim(f"{branch}.rpe_biases", 0))
    heads = []
    for i in groups:
        if f"layers.{i}.blocks.0.lla.dconv.weight" not in s:
            raise NotThisFamily(f"group {i} has no attention block")
        heads.append(2 * s.dim(f"layers.{i}.blocks.0.lla.dconv.weight", 0))
    common = {"in_chans": cin, "embed_dim": embed, "split_size": split,
              "depth": [s.count(f"layers.{i}.blocks.") for i in groups], "num_heads": heads,
              "expansion_factor": clean(s.dim("layers.0.blocks.0.ffn.fc1.weight", 0) / embed),
              "qkv_bias": "layers.0.blocks.0.swsa.qkv.bias" in s,
              "resi_connection": resi_connection(s, "conv_after_body")}
    mask = next((k for k in s.keys() if k.endswith(".swsa.attn_mask_0")), None)
    if mask is not None:
        side = square_side(s.dim(mask, 0) * split[0] * split[1], mask)
        multiple = math.lcm(*split)
        common["img_size"] = PUBLISHED_IMG_SIZE if math.ceil(PUBLISHED_IMG_SIZE / multiple) * multiple == side \
            else side
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"]}
            for r in reconstruction(s, cin) if r["out"] == cin and r["upsampler"]]


__all__ = ["DCT"]

register_recogniser("DCT", _recognise)
# neosr's name: the class defaults (neosr's; 1.12 M parameters at x4), the option file's top-level scale
register_presets("DCT", scale_arg="upscale", source="neosr", presets={"dct": {}})
