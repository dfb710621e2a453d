"""FDAT: Fast Dual Aggregation Transformer (stinkybread, 2025; no paper, code in traiNNer-redux and spandrel),
a lighter descendant of DAT (Chen et al., ICCV 2023).

Module names and constructor arguments follow spandrel 0.4.2's ``FDAT``, so released checkpoints load with
``strict=True`` and give the same output. A 3x3 stem (optionally after a pixel-unshuffle, ``unshuffle_mod`` for
scales 1 and 2) feeds ``num_groups`` residual groups; each holds ``depth_per_group`` repeats of
``group_block_pattern`` (spatial / channel) blocks. A block mixes a layer-normed input two ways, attention
(windowed self-attention with a learned bias per head, or transposed "channel" attention over L2-normalised
tokens) and a depth-wise 3x3 conv, and adds them with one gate (spatial blocks: a channel gate from the conv
branch scales the attention; channel blocks: a spatial gate from the attention scales the conv branch), then runs
a depth-wise-mixed feed-forward. A conv, the long shortcut and one of the eight ``UniUpsampleV3`` heads follow
("transpose+conv" by default; "lda" is a deformable-attention upsampler; the ``upsampler.MetaUpsample`` buffer
records the head as released checkpoints carry it).

Size requirement: none. Each spatial block zero-pads its normed tokens to the window multiple and crops (as the
original, without a mask); with ``unshuffle_mod`` the input is reflect-padded to the unshuffle factor and the
output cropped. ``tile_multiple`` is the window size (times the unshuffle factor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers
from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    LayerNorm2d,
    NearestUpsample,
    drop_path_rates,
    pad_bottom_right,
)
from anysr.archs.plksr_arch import DySample
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.recognition.recognise_util import clean, fitting_heads, head_mid, square_side
from anysr.ops.dcn import sample_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

# The head names in the order their index is stored in ``MetaUpsample``.
SAMPLE_MODS3 = ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "dysample", "transpose+conv", "lda",
                "pa_up")
BLOCK_TYPES = ("spatial", "channel")


def _steps(scale: int, head: str) -> list[int]:
    """Upsampling steps of x2 (for a power of two) or one x3."""
    if scale == 3:
        return [3]
    if scale & (scale - 1) == 0:
        return [2] * int(math.log2(scale))
    raise ArchArgumentError("scale", f"FDAT's {head!r} upsampler supports scales 2^n and 3, not {scale}")


class PA(nn.Module):
    """Pixel attention: the input times ``sigmoid(conv1x1(input))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.conv(x)


def _linear_taps(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ``align_corners`` linear resampling along one axis: the two source indices and the weight of the
    second for every destination index (``src`` / ``dst``: float aranges of the two lengths, at least 2 long)."""
    pos = dst * (src[-1] / dst[-1])
    first = pos.floor()
    return first.long(), torch.minimum(first + 1, src[-1]).long(), pos - first


def upsample_bilinear_corners(x: torch.Tensor, in_rows: torch.Tensor, out_rows: torch.Tensor,
                              in_cols: torch.Tensor, out_cols: torch.Tensor) -> torch.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=True)`` from two gathers per axis (the same
    weights; XLA has no lowering of upsample_bilinear2d's backward, and the ONNX graph keeps the sizes symbolic).
    The aranges give the input / output lengths."""
    r0, r1, fr = _linear_taps(in_rows, out_rows)
    c0, c1, fc = _linear_taps(in_cols, out_cols)
    fr, fc = fr.to(x.dtype).view(-1, 1), fc.to(x.dtype)
    y = x.index_select(2, r0) * (1 - fr) + x.index_select(2, r1) * fr
    return y.index_select(3, c0) * (1 - fc) + y.index_select(3, c1) * fc


class LDA_AQU(nn.Module):  # noqa: N801 - the original's module name
    """Learnable deformable-attention upsampler (after Du et al., "LDA-AQU", 2024): every output pixel attends
    over ``k_u**2`` keys / values sampled around it at offsets predicted from the bilinearly upsampled queries.

    One head, ``n_groups`` offset groups, channels reduced by ``reduction_factor`` for queries and keys; the values
    are the (un-normed) input. Sampling positions are in output pixels and normalised by the output side minus one
    (``align_corners`` sampling of the input), as the original computes them; positions are float32 even under
    bf16 autocast. The output has the input's channels at ``scale_factor`` times the size.
    """

    def __init__(self, in_channels: int = 48, reduction_factor: int = 4, nh: int = 1, scale_factor: int = 2,
                 k_e: int = 3, k_u: int = 3, n_groups: int = 2, range_factor: float = 11, rpb: bool = True) -> None:
        super().__init__()
        if in_channels % (reduction_factor * n_groups * nh):
            raise ArchArgumentError("mid_dim", f"FDAT's 'lda' upsampler needs mid_dim ({in_channels}) to be a "
                                    f"multiple of {reduction_factor * n_groups * nh}")
        self.k_u, self.num_head, self.scale_factor = k_u, nh, scale_factor
        self.n_groups, self.offset_range_factor, self.rpb = n_groups, range_factor, rpb
        self.hidden_dim = in_channels // reduction_factor
        self.scale = (self.hidden_dim // nh) ** -0.5
        self.proj_q = nn.Conv2d(in_channels, self.hidden_dim, 1, bias=False)
        self.proj_k = nn.Conv2d(in_channels, self.hidden_dim, 1, bias=False)
        gc = self.hidden_dim // n_groups
        self.conv_offset = nn.Sequential(nn.Conv2d(gc, gc, 3, 1, 1, groups=gc, bias=False), LayerNorm2d(gc),
                                         nn.SiLU(), nn.Conv2d(gc, 2 * k_u**2, k_e, 1, k_e // 2))
        self.layer_norm = LayerNorm2d(in_channels)
        # (row, column) offset of each of the k_u x k_u kernel taps, row-major: channels (2 * tap + {0: row, 1: col})
        r = torch.arange(k_u, dtype=torch.float32) - (k_u - 1) // 2
        base = torch.stack([r.view(-1, 1).expand(k_u, k_u), r.view(1, -1).expand(k_u, k_u)], dim=-1)
        self.register_buffer("base_offset", base.reshape(1, -1, 1, 1), persistent=False)
        if rpb:
            self.relative_position_bias_table = nn.Parameter(torch.zeros(1, nh, 1, k_u**2, self.hidden_dim // nh))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def _sample(self, feats: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, row_last: torch.Tensor,
                col_last: torch.Tensor) -> torch.Tensor:
        """Bilinear samples (zeros outside) of ``feats`` (b, c, h, w) at output-pixel positions ``rows`` / ``cols``
        (b * g, taps, oh, ow), as (b, oh * ow, taps, c) with the groups' channels side by side. ``row_last`` /
        ``col_last``: oh - 1 and ow - 1 as tensors (so an ONNX graph keeps them symbolic)."""
        b, c, h, w = feats.shape
        g, bg = self.n_groups, rows.shape[0]
        taps, oh, ow = rows.shape[1:]
        if resamples_by_gathers(feats.device):  # no grid_sample lowering there: the same samples from gathers
            pts = taps * oh * ow
            py = rows * ((h - 1) / (oh - 1))  # input pixel coordinates (align_corners)
            px = cols * ((w - 1) / (ow - 1))
            out = sample_bilinear(feats.to(py.dtype), px.reshape(b, g, pts).transpose(1, 2),
                                  py.reshape(b, g, pts).transpose(1, 2))  # (b, pts, g, c // g)
            out = out.reshape(b, taps, oh * ow, c).transpose(1, 2)
        else:
            grid = torch.stack([2 * cols / col_last - 1, 2 * rows / row_last - 1], dim=-1)
            out = F.grid_sample(feats.reshape(bg, c // g, h, w).to(grid.dtype), grid.reshape(bg, taps * oh, ow, 2),
                                mode="bilinear", padding_mode="zeros", align_corners=True)
            out = out.reshape(b, g, c // g, taps, oh * ow).permute(0, 4, 3, 1, 2).reshape(b, oh * ow, taps, c)
        return out.to(feats.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        oh, ow = h * self.scale_factor, w * self.scale_factor  # an integer scale: sizes stay symbolic in ONNX
        g, nh, taps = self.n_groups, self.num_head, self.k_u**2
        work = torch.promote_types(x.dtype, torch.float32)
        out_rows = torch.arange(oh, device=x.device, dtype=work)
        out_cols = torch.arange(ow, device=x.device, dtype=work)
        in_rows = torch.arange(h, device=x.device, dtype=work)
        in_cols = torch.arange(w, device=x.device, dtype=work)
        normed = self.layer_norm(x)
        q = upsample_bilinear_corners(self.proj_q(normed), in_rows, out_rows, in_cols, out_cols)
        k = self.proj_k(normed)
        pred = self.conv_offset(q.reshape(b * g, -1, oh, ow)).to(work)
        offset = (pred.tanh() * self.offset_range_factor + self.base_offset).reshape(b * g, taps, 2, oh, ow)
        rows = offset[:, :, 0] + out_rows.view(1, 1, oh, 1)
        cols = offset[:, :, 1] + out_cols.view(1, 1, 1, ow)
        keys = self._sample(k, rows, cols, out_rows[-1], out_cols[-1])
        values = self._sample(x, rows, cols, out_rows[-1], out_cols[-1])
        keys = keys.reshape(b, oh * ow, taps, nh, -1).permute(0, 3, 1, 2, 4)
        values = values.reshape(b, oh * ow, taps, nh, -1).permute(0, 3, 1, 2, 4)
        if self.rpb:
            keys = keys + self.relative_position_bias_table
        queries = q.reshape(b, nh, -1, oh * ow).transpose(2, 3).unsqueeze(3)  # (b, nh, L, 1, d)
        attn = ((queries * self.scale) @ keys.transpose(-1, -2)).softmax(dim=-1)  # (b, nh, L, 1, taps)
        out = (attn @ values).squeeze(3)  # (b, nh, L, c // nh)
        return out.permute(0, 1, 3, 2).reshape(b, c, oh, ow)


class UniUpsampleV3(nn.Sequential):
    """The upsampling head (version 3 of the family), with a ``MetaUpsample`` uint8 buffer recording (3, head
    index, scale, in_dim, out_dim, mid_dim, group); for "pa_up" at a power-of-two scale the recorded in_dim is
    ``mid_dim``, as the original records it."""

    def __init__(self, upsample: str = "pa_up", scale: int = 2, in_dim: int = 48, out_dim: int = 3,
                 mid_dim: int = 48, group: int = 4) -> None:
        if upsample not in SAMPLE_MODS3:
            raise ArchArgumentError("upsampler_type", f"FDAT has no upsampler {upsample!r}; choose one of "
                                    f"{', '.join(SAMPLE_MODS3)}")
        layers: list[nn.Module] = []
        if scale == 1 or upsample == "conv":
            layers.append(nn.Conv2d(in_dim, out_dim, 3, 1, 1))
        elif upsample == "pixelshuffledirect":
            layers += [nn.Conv2d(in_dim, out_dim * scale**2, 3, 1, 1), nn.PixelShuffle(scale)]
        elif upsample == "pixelshuffle":
            layers += [nn.Conv2d(in_dim, mid_dim, 3, 1, 1), nn.LeakyReLU(inplace=True)]
            for s in _steps(scale, upsample):
                layers += [nn.Conv2d(mid_dim, s * s * mid_dim, 3, 1, 1), nn.PixelShuffle(s)]
            layers.append(nn.Conv2d(mid_dim, out_dim, 3, 1, 1))
        elif upsample == "nearest+conv":
            for s in _steps(scale, upsample):
                layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), NearestUpsample(s), nn.LeakyReLU(0.2, inplace=True)]
            layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                       nn.Conv2d(in_dim, out_dim, 3, 1, 1)]
        elif upsample == "dysample":
            if mid_dim != in_dim:
                layers += [nn.Conv2d(in_dim, mid_dim, 3, 1, 1), nn.LeakyReLU(inplace=True)]
            layers.append(DySample(mid_dim, out_dim, scale, group))
        elif upsample == "transpose+conv":
            if scale == 2:
                layers.append(nn.ConvTranspose2d(in_dim, out_dim, 4, 2, 1))
            elif scale == 3:
                layers.append(nn.ConvTranspose2d(in_dim, out_dim, 3, 3, 0))
            elif scale == 4:
                layers += [nn.ConvTranspose2d(in_dim, in_dim, 4, 2, 1), nn.GELU(),
                           nn.ConvTranspose2d(in_dim, out_dim, 4, 2, 1)]
            else:
                raise ArchArgumentError("scale", f"FDAT's 'transpose+conv' upsampler supports scales 1-4, not {scale}")
            layers.append(nn.Conv2d(out_dim, out_dim, 3, 1, 1))
        elif upsample == "pa_up":
            steps = _steps(scale, upsample)
            for s in steps:
                layers += [NearestUpsample(s), nn.Conv2d(in_dim, mid_dim, 3, 1, 1), PA(mid_dim),
                           nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(mid_dim, mid_dim, 3, 1, 1),
                           nn.LeakyReLU(0.2, inplace=True)]
                if s == 2:
                    in_dim = mid_dim
            layers.append(nn.Conv2d(mid_dim, out_dim, 3, 1, 1))
        else:  # lda
            if mid_dim != in_dim:
                layers += [nn.Conv2d(in_dim, mid_dim, 3, 1, 1), nn.LeakyReLU(inplace=True)]
            layers += [LDA_AQU(mid_dim, scale_factor=scale), nn.Conv2d(mid_dim, out_dim, 3, 1, 1)]
        super().__init__(*layers)
        meta = [3, SAMPLE_MODS3.index(upsample), scale, in_dim, out_dim, mid_dim, group]
        self.register_buffer("MetaUpsample", torch.tensor([v % 256 for v in meta], dtype=torch.uint8))


class FastSpatialWindowAttention(nn.Module):
    """Self-attention inside non-overlapping ``window_size`` windows with a learned (head, query, key) bias.
    Takes and returns (b, h, w, c) maps; sides are zero-padded to the window multiple (no mask) and cropped."""

    def __init__(self, dim: int, window_size: int = 8, num_heads: int = 4, qkv_bias: bool = False) -> None:
        super().__init__()
        self.ws, self.nh = window_size, num_heads
        self.window_size = window_size  # what tiling checks the tile multiple against
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        n = window_size * window_size
        self.bias = nn.Parameter(torch.zeros(num_heads, n, n))
        nn.init.trunc_normal_(self.bias, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        ws, nh = self.ws, self.nh
        pad_h, pad_w = (-h) % ws, (-w) % ws
        if pad_h or pad_w:
            x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        hp, wp = h + pad_h, w + pad_w
        nwh, nww = hp // ws, wp // ws
        win = x.reshape(b, nwh, ws, nww, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        q, k, v = self.qkv(win).reshape(-1, ws * ws, 3, nh, c // nh).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype), scale=self.scale)
        out = self.proj(out.transpose(1, 2).reshape(-1, ws * ws, c))
        out = out.reshape(b, nwh, nww, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        return out[:, :h, :w] if pad_h or pad_w else out


class FastChannelAttention(nn.Module):
    """Transposed attention: per head, a (head_dim x head_dim) map between L2-normalised query and key channels
    (each normalised over the tokens), scaled by a learned temperature. Takes and returns (b, h, w, c)."""

    def __init__(self, dim: int, num_heads: int = 4, qkv_bias: bool = False) -> None:
        super().__init__()
        self.nh = num_heads
        self.temp = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        # (3, b, heads, head_dim, tokens)
        q, k, v = self.qkv(x).reshape(b, h * w, 3, self.nh, c // self.nh).permute(2, 0, 3, 4, 1).unbind(0)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1) * self.temp).softmax(dim=-1)
        out = (attn @ v).permute(0, 3, 1, 2).reshape(b, h, w, c)
        return self.proj(out)


class SimplifiedAIM(nn.Module):
    """The attention / conv fusion gate: ``sg`` (1x1 conv to one map, sigmoid) for spatial gating, ``cg``
    (squeeze-excitation: mean, 1x1 down by ``reduction_ratio``, GELU, 1x1 up, sigmoid) for channel gating."""

    def __init__(self, dim: int, reduction_ratio: int = 8) -> None:
        super().__init__()
        self.sg = nn.Sequential(nn.Conv2d(dim, 1, 1, bias=False), nn.Sigmoid())
        self.cg = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dim, dim // reduction_ratio, 1, bias=False),
                                nn.GELU(), nn.Conv2d(dim // reduction_ratio, dim, 1, bias=False), nn.Sigmoid())

    def channel_gate(self, conv_feat: torch.Tensor) -> torch.Tensor:
        """(b, 1, 1, c) gate from a (b, h, w, c) map (the mean replaces the adaptive pool: same numbers)."""
        pooled = conv_feat.mean(dim=(1, 2), keepdim=True).permute(0, 3, 1, 2)
        return self.cg[1:](pooled).permute(0, 2, 3, 1)

    def forward(self, attn_feat: torch.Tensor, conv_feat: torch.Tensor, spatial_block: bool) -> torch.Tensor:
        if spatial_block:  # the conv branch's channel statistics modulate the attention
            return attn_feat * self.channel_gate(conv_feat) + conv_feat
        gate = self.sg(attn_feat.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return attn_feat + conv_feat * gate


class SimplifiedFFN(nn.Module):
    """``fc2(dwconv3x3(gelu(fc1(x))))``, bias-free, hidden width ``int(dim * expansion_ratio)``."""

    def __init__(self, dim: int, expansion_ratio: float = 2.0) -> None:
        super().__init__()
        hidden = int(dim * expansion_ratio)
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim, bias=False)
        self.smix = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.fc1(x)).permute(0, 3, 1, 2)
        return self.fc2(self.smix(y).permute(0, 2, 3, 1))


class SimplifiedDATBlock(nn.Module):
    """One block on (b, h, w, c) maps: ``x + drop(AIM(attn(n1(x)), dwconv(n1(x))))``, then
    ``x + drop(ffn(n2(x)))``."""

    def __init__(self, dim: int, nh: int, ws: int, ffn_exp: float, aim_re: int, btype: str, dp: float,
                 qkv_b: bool = False) -> None:
        super().__init__()
        self.spatial = btype == "spatial"
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = FastSpatialWindowAttention(dim, ws, nh, qkv_b) if self.spatial else \
            FastChannelAttention(dim, nh, qkv_b)
        self.conv = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, groups=dim, bias=False), nn.GELU())
        self.inter = SimplifiedAIM(dim, aim_re)
        # Each block uses one of the two gates; the other's weights stay in checkpoints but are never trained
        # (so no parameter goes unused under DDP).
        (self.inter.sg if self.spatial else self.inter.cg).requires_grad_(False)
        self.dp = DropPath(dp) if dp > 0.0 else nn.Identity()
        self.ffn = SimplifiedFFN(dim, ffn_exp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.n1(x)
        conv = self.conv(y.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = x + self.dp(self.inter(self.attn(y), conv, self.spatial))
        return x + self.dp(self.ffn(self.n2(x)))


class SimplifiedResidualGroup(nn.Module):
    """Blocks on the channels-last view of a (b, c, h, w) map, a bias-free 3x3 conv, plus the input."""

    def __init__(self, dim: int, depth: int, nh: int, ws: int, ffn_exp: float, aim_re: int, pattern: Sequence[str],
                 dp_rates: Sequence[float]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([SimplifiedDATBlock(dim, nh, ws, ffn_exp, aim_re, pattern[i % len(pattern)],
                                                        dp_rates[i]) for i in range(depth)])
        self.conv = nn.Conv2d(dim, dim, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.permute(0, 2, 3, 1)
        for block in self.blocks:
            y = block(y)
        return self.conv(y.permute(0, 3, 1, 2)) + x


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def _keep_own_meta(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A checkpoint's ``upsampler.MetaUpsample`` is replaced by the network's own (the original does the same:
    the buffer describes the head the network was built with)."""
    key = prefix + "upsampler.MetaUpsample"
    if key in state_dict:
        state_dict[key] = module.upsampler.MetaUpsample


@ARCH_REGISTRY.register()
class FDAT(nn.Module):
    """FDAT (see the module docstring). ``img_range`` is accepted for the original signature and has no effect
    (the original's mean is zero)."""

    def __init__(self, *, num_in_ch: int = 3, num_out_ch: int = 3, scale: int = 4, embed_dim: int = 120,
                 num_groups: int = 4, depth_per_group: int = 3, num_heads: int = 4, window_size: int = 8,
                 ffn_expansion_ratio: float = 2.0, aim_reduction_ratio: int = 8,
                 group_block_pattern: list[str] | None = None, drop_path_rate: float = 0.1, mid_dim: int = 64,
                 upsampler_type: str = "transpose+conv", img_range: float = 1.0,
                 unshuffle_mod: bool = False) -> None:
        super().__init__()
        pattern = list(group_block_pattern) if group_block_pattern is not None else list(BLOCK_TYPES)
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"FDAT needs an integer scale >= 1, not {scale!r}")
        if num_heads < 1 or embed_dim % num_heads:
            raise ArchArgumentError("num_heads", f"FDAT needs embed_dim ({embed_dim}) to be a multiple of "
                                    f"num_heads ({num_heads})")
        if window_size < 1:
            raise ArchArgumentError("window_size", f"FDAT needs window_size >= 1, not {window_size}")
        if aim_reduction_ratio < 1 or embed_dim < aim_reduction_ratio:
            raise ArchArgumentError("aim_reduction_ratio", f"FDAT needs 1 <= aim_reduction_ratio <= embed_dim "
                                    f"({embed_dim}), not {aim_reduction_ratio}")
        if not pattern or any(p not in BLOCK_TYPES for p in pattern):
            raise ArchArgumentError("group_block_pattern", f"FDAT's blocks are 'spatial' or 'channel', not {pattern}")
        self.img_range, self.upscale = img_range, scale
        self.num_in_ch = num_in_ch  # what the network reads (the stem may pixel-unshuffle it first)
        self.pad = 1
        if unshuffle_mod and scale < 3:
            factor = 4 // scale
            self.conv_first = nn.Sequential(nn.PixelUnshuffle(factor),
                                            nn.Conv2d(num_in_ch * factor**2, embed_dim, 3, 1, 1))
            self.pad, scale = factor, 4
        else:
            self.conv_first = nn.Conv2d(num_in_ch, embed_dim, 3, 1, 1)
        self.tile_multiple = window_size * self.pad
        depth = depth_per_group * len(pattern)
        rates = drop_path_rates(drop_path_rate, num_groups * depth)
        self.groups = nn.Sequential(*[
            SimplifiedResidualGroup(embed_dim, depth, num_heads, window_size, ffn_expansion_ratio,
                                    aim_reduction_ratio, pattern, rates[i * depth:(i + 1) * depth])
            for i in range(num_groups)])
        self.conv_after = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1, bias=False)
        self.upsampler = UniUpsampleV3(upsampler_type, scale, embed_dim, num_out_ch, mid_dim, 4)
        self.apply(_init_weights)
        self.register_load_state_dict_pre_hook(_keep_own_meta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.pad > 1:
            x = pad_bottom_right(x, (-h) % self.pad, (-w) % self.pad)
        shallow = self.conv_first(x)
        out = self.upsampler(self.conv_after(self.groups(shallow)) + shallow)
        if self.pad > 1:
            out = out[:, :, : h * self.upscale, : w * self.upscale]
        return out


register_presets("FDAT", scale_arg="scale", presets={
    "fdat_tiny": {"embed_dim": 96, "num_groups": 2, "depth_per_group": 2, "num_heads": 3,
                  "ffn_expansion_ratio": 1.5, "drop_path_rate": 0.05},
    "fdat_light": {"embed_dim": 108, "num_groups": 3, "depth_per_group": 2,
                   "drop_path_rate": 0.08},
    "fdat_medium": {},
    "fdat_medium_aligned": {"embed_dim": 128},
    "fdat_large": {"embed_dim": 180, "depth_per_group": 4, "num_heads": 6},
    "fdat_xl": {"embed_dim": 180, "num_groups": 6, "depth_per_group": 6, "num_heads": 6},
})


def _recognise(s: StateShapes) -> list[dict]:
    """FDAT from its tensors: width and channels from the stem (pixel-unshuffled for x1 / x2 with
    ``unshuffle_mod``), groups, the block pattern (spatial blocks have a window bias, channel blocks a
    temperature) and its repeats, heads and window from them, the FFN and gate ratios (the published reduction 8
    when it gives that width), and the upsampler (kind, scale, output channels and mid width: the candidates whose
    head builds the file's tensors; nearest+conv and pa_up heads are the same at x2 and x3: x2 is proposed
    first; an lda head is the same at every scale: x4 first)."""
    unshuffle = "conv_first.1.weight" in s
    stem = s.shape("conv_first.1.weight" if unshuffle else "conv_first.weight")
    embed = stem[0]
    kinds = []
    for b in s.indices("groups.0.blocks."):
        kinds.append("spatial" if f"groups.0.blocks.{b}.attn.bias" in s else "channel")
    if not kinds:
        return []
    period = next(p for p in range(1, len(kinds) + 1)  # the whole list at the latest
                  if len(kinds) % p == 0 and all(k == kinds[i % p] for i, k in enumerate(kinds)))
    spatial = kinds.index("spatial") if "spatial" in kinds else None
    heads_key = f"groups.0.blocks.{spatial}.attn.bias" if spatial is not None else "groups.0.blocks.0.attn.temp"
    gate = s.dim("groups.0.blocks.0.inter.cg.1.weight", 0)
    common = {"embed_dim": embed, "num_groups": s.count("groups."), "depth_per_group": len(kinds) // period,
              "num_heads": s.dim(heads_key, 0),
              "window_size": square_side(s.dim(heads_key, 1), heads_key) if spatial is not None else 8,
              "ffn_expansion_ratio": clean(s.dim("groups.0.blocks.0.ffn.fc1.weight", 0) / embed),
              "aim_reduction_ratio": 8 if embed // 8 == gate else embed // gate,
              "group_block_pattern": kinds[:period], "unshuffle_mod": unshuffle}
    if unshuffle:
        fold = next((f for f in (2, 4) if stem[1] % (f * f) == 0 and stem[1] // (f * f) in (3, 1, 4)), None)
        if fold is None:
            return []
        cins, scales = [(stem[1] // (fold * fold), 4 // fold)], (4,)
    else:
        cins, scales = [(stem[1], 0)], (4, 2, 3, 1, 8)
    last = max(i for i in s.indices("upsampler.") if f"upsampler.{i}.weight" in s)
    width = s.dim(f"upsampler.{last}.weight", 0)  # the output channels, times scale**2 for a one-step head
    found = []
    for cin, folded_scale in cins:
        outs = [width, *(out for out, _ in shuffle_splits(width, (cin, 3, 1))), cin, 3, 1]
        for head in fitting_heads(s, "upsampler",
                                  lambda kind, scale, out, mid: UniUpsampleV3(kind, scale, embed, out, mid, 4),
                                  ("transpose+conv", *(k for k in SAMPLE_MODS3 if k != "transpose+conv")), scales,
                                  outs, lambda kind: head_mid(s, "upsampler", kind, embed)):
            found.append({"num_in_ch": cin, "num_out_ch": head["out"], "scale": folded_scale or head["scale"],
                          **common, "mid_dim": head["mid"], "upsampler_type": head["kind"]})
    return found


register_recogniser("FDAT", _recognise)
