"""DAT: Dual Aggregation Transformer for image super-resolution (Chen et al., ICCV 2023).

One class covers DAT, DAT-S, DAT-2 and DAT-light (they differ only in arguments). Constructor arguments,
module names and buffers follow the authors' code (zhengchen1999/DAT), so their released ``.pth`` files
load with ``strict=True`` and give their outputs.

Blocks alternate between spatial window attention (DSTB: half the channels in ``split_size[0] x
split_size[1]`` windows, the other half in the transposed windows, shifted in some blocks, with a dynamic
position bias) and channel attention over the whole image (DCTB); both mix in a depth-wise conv branch
(adaptive interaction), and the feed-forward network has a spatial gate.

Any height/width works as in the authors' code: the spatial attention zero-pads its queries/keys/values to
a multiple of the windows inside each block and crops back, so no padding happens around the network.
``tile_multiple`` is the side multiple for which that padding is empty. Training on one image per batch
works too (the authors' pooled batch norm refuses it; see ``PooledBatchNorm2d``).

``DAT_iLN`` (traiNNer-redux's i-LN variant) is the same network built with ``ImageLayerNorm`` as the blocks'
norm (each residual branch rescaled by the norm's scale), affine transforms around the body and no mean shift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    AffineTransform,
    ArchArgumentError,
    DropPath,
    ImageLayerNorm,
    SwinSRBase,
    check_upscale,
    drop_path_rates,
    pre_norm,
    relative_position_index,
    rescaled,
    residual_conv,
    run_checkpointed,
    shifted_window_mask,
    to_2tuple,
    to_feature_map,
    to_tokens,
    window_attention,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import (
    PUBLISHED_IMG_SIZE,
    clean,
    reconstruction,
    resi_connection,
    square_side,
    window_pair,
)
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect")


class _ToTokens(nn.Module):
    """(b, c, h, w) -> (b, h*w, c) as a module (first entry of ``before_RG``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return to_tokens(x)


class _AffineTokens(nn.Module):
    """DAT_iLN's ``before_RG``: tokens, then an affine transform (``norm``; traiNNer-redux's names)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = AffineTransform(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(to_tokens(x))


class PooledBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d after global pooling. Training on a single image leaves one value per channel, where batch
    statistics do not exist (torch refuses, and so does the authors' DAT); then the running statistics
    normalise instead. Otherwise, and in its parameters and buffers, it is ``nn.BatchNorm2d``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        return super().forward(x)


def _interaction_branches(dim: int) -> tuple[nn.Sequential, nn.Sequential, nn.Sequential]:
    """Depth-wise conv branch, channel map (pooled, 1/8 bottleneck) and spatial map (1/16 bottleneck)."""
    dwconv = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, groups=dim), nn.BatchNorm2d(dim), nn.GELU())
    channel = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dim, dim // 8, 1), PooledBatchNorm2d(dim // 8),
                            nn.GELU(), nn.Conv2d(dim // 8, dim, 1))
    spatial = nn.Sequential(nn.Conv2d(dim, dim // 16, 1), nn.BatchNorm2d(dim // 16), nn.GELU(),
                            nn.Conv2d(dim // 16, 1, 1))
    return dwconv, channel, spatial


class SpatialGate(nn.Module):
    """Split the channels in halves and multiply the first by a depth-wise conv of the (normed) second."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x1 * to_tokens(self.conv(to_feature_map(self.norm(x2), h, w)))


class SGFN(nn.Module):
    """Spatial-gate feed-forward network: linear, activation, spatial gate (halves the width), linear."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.sg = SpatialGate(hidden_features // 2)
        self.fc2 = nn.Linear(hidden_features // 2, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))
        x = self.drop(self.sg(x, h, w))
        return self.drop(self.fc2(x))


class DynamicPosBias(nn.Module):
    """Relative position bias made by a small MLP from the (dy, dx) offsets (one value per head)."""

    def __init__(self, dim: int, num_heads: int, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.num_heads = num_heads
        self.pos_dim = dim // 4
        self.pos_proj = nn.Linear(2, self.pos_dim)
        self.pos1 = nn.Sequential(nn.LayerNorm(self.pos_dim), nn.ReLU(inplace=True),
                                  nn.Linear(self.pos_dim, self.pos_dim))
        self.pos2 = nn.Sequential(nn.LayerNorm(self.pos_dim), nn.ReLU(inplace=True),
                                  nn.Linear(self.pos_dim, self.pos_dim))
        self.pos3 = nn.Sequential(nn.LayerNorm(self.pos_dim), nn.ReLU(inplace=True),
                                  nn.Linear(self.pos_dim, self.num_heads))

    def forward(self, biases: torch.Tensor) -> torch.Tensor:
        pos = self.pos_proj(biases)
        if self.residual:
            pos = pos + self.pos1(pos)
            pos = pos + self.pos2(pos)
            return self.pos3(pos)
        return self.pos3(self.pos2(self.pos1(pos)))


class Spatial_Attention(nn.Module):  # noqa: N801 - the authors' class name
    """Self attention in (rectangular) windows: ``split_size`` for ``idx`` 0, transposed for ``idx`` 1."""

    def __init__(self, dim: int, idx: int, split_size: Sequence[int] = (8, 8), dim_out: int | None = None,
                 num_heads: int = 6, attn_drop: float = 0.0, proj_drop: float = 0.0, qk_scale: float | None = None,
                 position_bias: bool = True) -> None:
        super().__init__()
        if idx not in (0, 1):
            raise ArchArgumentError("idx", f"DAT: window branch idx must be 0 or 1, got {idx!r}")
        self.dim = dim
        self.dim_out = dim_out or dim
        self.split_size = split_size
        self.num_heads = num_heads
        self.idx = idx
        self.position_bias = position_bias
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.H_sp, self.W_sp = (split_size[0], split_size[1]) if idx == 0 else (split_size[1], split_size[0])
        if position_bias:
            hs, ws = self.H_sp, self.W_sp
            self.pos = DynamicPosBias(self.dim // 4, self.num_heads, residual=False)
            offsets = torch.stack(torch.meshgrid(torch.arange(1 - hs, hs), torch.arange(1 - ws, ws),
                                                 indexing="ij"))
            self.register_buffer("rpe_biases", offsets.flatten(1).transpose(0, 1).float().contiguous())
            self.register_buffer("relative_position_index", relative_position_index((hs, ws)))
        self.attn_drop = nn.Dropout(attn_drop)

    def _windows(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(b, h*w, c) -> (b * windows, heads, H_sp*W_sp, c/heads)."""
        b, _, c = x.shape
        hs, ws = self.H_sp, self.W_sp
        x = x.reshape(b, h // hs, hs, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, hs * ws, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, qkv: torch.Tensor, h: int, w: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """qkv: (3, b, h*w, c) with h, w multiples of the window; mask: (windows, n, n) or None -> (b, h, w, c)."""
        b, _, c = qkv.shape[1:]
        hs, ws = self.H_sp, self.W_sp
        q, k, v = (self._windows(t, h, w) for t in qkv)
        n = hs * ws
        if self.position_bias:
            pos = self.pos(self.rpe_biases)
            bias = pos[self.relative_position_index.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        else:
            bias = q.new_zeros(1, n, n)
        x = window_attention(q, k, v, bias, mask, scale=self.scale,
                             dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x.transpose(1, 2).reshape(b, h // hs, w // ws, hs, ws, c)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


def _is_shifted(rg_idx: int, b_idx: int) -> bool:
    """Which spatial blocks shift their windows (the authors' pattern: blocks 2, 6, 10... of even groups,
    blocks 0, 4, 8... of odd groups)."""
    if rg_idx % 2 == 0:
        return b_idx > 0 and (b_idx - 2) % 4 == 0
    return b_idx % 4 == 0


class ShiftedWindowPair(nn.Module):
    """Spatial window attention on two channel halves (window and transposed window, shifted in the blocks DAT
    shifts) and an output projection: DAT's attention without its conv interaction (neosr's DCT uses it so)."""

    family = "DAT"  # named in argument errors

    def __init__(self, dim: int, num_heads: int, reso: int = 64, split_size: Sequence[int] = (8, 8),
                 shift_size: Sequence[int] = (1, 2), qkv_bias: bool = False, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, rg_idx: int = 0, b_idx: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.split_size = split_size
        self.shift_size = shift_size
        self.b_idx = b_idx
        self.rg_idx = rg_idx
        self.patches_resolution = reso
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        for i in (0, 1):
            if not 0 <= shift_size[i] < split_size[i]:
                raise ArchArgumentError("split_size", f"{self.family}: shift {shift_size[i]} must be in "
                                        f"[0, split_size[{i}]={split_size[i]})")
        self.branch_num = 2
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop)
        self.attns = nn.ModuleList([
            Spatial_Attention(dim // 2, idx=i, split_size=split_size, num_heads=num_heads // 2, dim_out=dim // 2,
                              qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop, position_bias=True)
            for i in range(self.branch_num)
        ])
        self.shifted = _is_shifted(rg_idx, b_idx)
        masks: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        if self.shifted:
            # Kept for the authors' state-dict keys (for reso rounded up to the windows); forward computes
            # the masks for the actual size.
            side = math.ceil(reso / self.multiple) * self.multiple
            masks = self.calculate_mask(side, side)
        self.register_buffer("attn_mask_0", masks[0])
        self.register_buffer("attn_mask_1", masks[1])

    @property
    def multiple(self) -> int:
        """Both window shapes tile a map whose sides are multiples of this."""
        return math.lcm(self.split_size[0], self.split_size[1])

    def calculate_mask(self, h: int, w: int, device: torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Shifted-window masks of both branches on an ``h x w`` map (multiples of the windows)."""
        (s0, s1), (t0, t1) = self.split_size, self.shift_size
        return (shifted_window_mask(h, w, (s0, s1), (t0, t1), device, dtype),
                shifted_window_mask(h, w, (s1, s0), (t1, t0), device, dtype))

    def attend(self, qkv: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """qkv: (3, b, n, c) -> the two halves' window attention, (b, n, c), before the projection."""
        _, b, n, c = qkv.shape
        half = c // 2
        multiple = self.multiple
        pad_b, pad_r = (-h) % multiple, (-w) % multiple
        hp, wp = h + pad_b, w + pad_r
        qkv = F.pad(qkv.reshape(3, b, h, w, c), (0, 0, 0, pad_r, 0, pad_b))  # zeros, as the authors pad
        parts = [qkv[..., :half], qkv[..., half:]]
        if self.shifted:
            (t0, t1) = self.shift_size
            shifts = ((t0, t1), (t1, t0))
            masks: Sequence[torch.Tensor | None] = self.calculate_mask(hp, wp, qkv.device, qkv.dtype)
            parts = [torch.roll(p, shifts=(-s[0], -s[1]), dims=(2, 3)) for p, s in zip(parts, shifts, strict=True)]
        else:
            shifts, masks = ((0, 0), (0, 0)), (None, None)
        outs = []
        for attn, part, shift, mask in zip(self.attns, parts, shifts, masks, strict=True):
            y = attn(part.reshape(3, b, hp * wp, half), hp, wp, mask=mask)
            if self.shifted:
                y = torch.roll(y, shifts=shift, dims=(1, 2))
            outs.append(y[:, :h, :w, :].reshape(b, n, half))
        return torch.cat(outs, dim=2)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """x: (b, h*w, c) -> (b, h*w, c)."""
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, c).permute(2, 0, 1, 3)  # (3, b, n, c)
        return self.proj_drop(self.proj(self.attend(qkv, h, w)))


class Adaptive_Spatial_Attention(ShiftedWindowPair):  # noqa: N801 - the authors' class name
    """Spatial window attention on two channel halves (window and transposed window) + a depth-wise conv
    branch; each modulates the other (channel map onto the attention, spatial map onto the conv)."""

    def __init__(self, dim: int, num_heads: int, reso: int = 64, split_size: Sequence[int] = (8, 8),
                 shift_size: Sequence[int] = (1, 2), qkv_bias: bool = False, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, rg_idx: int = 0, b_idx: int = 0) -> None:
        super().__init__(dim, num_heads, reso, split_size, shift_size, qkv_bias, qk_scale, drop, attn_drop, rg_idx,
                         b_idx)
        self.dwconv, self.channel_interaction, self.spatial_interaction = _interaction_branches(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """x: (b, h*w, c) -> (b, h*w, c)."""
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, c).permute(2, 0, 1, 3)  # (3, b, n, c)
        v = to_feature_map(qkv[2], h, w)
        attended = self.attend(qkv, h, w)
        conv_x = self.dwconv(v)
        channel_map = self.channel_interaction(conv_x).view(b, 1, c)
        spatial_map = self.spatial_interaction(to_feature_map(attended, h, w))
        attended = attended * torch.sigmoid(channel_map)
        conv_x = to_tokens(torch.sigmoid(spatial_map) * conv_x)
        return self.proj_drop(self.proj(attended + conv_x))


class Adaptive_Channel_Attention(nn.Module):  # noqa: N801 - the authors' class name
    """Channel (transposed) self attention over all tokens + a depth-wise conv branch; the spatial map
    modulates the attention, the channel map the conv."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        del qk_scale  # accepted as the authors do; the learned temperature scales this attention
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwconv, self.channel_interaction, self.spatial_interaction = _interaction_branches(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """x: (b, h*w, c) -> (b, h*w, c)."""
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 4, 1)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (b, heads, d, n)
        q = F.normalize(q, dim=-1)
        k = F.normalize(k, dim=-1)
        attn = self.attn_drop(((q @ k.transpose(-2, -1)) * self.temperature).softmax(dim=-1))
        attended = (attn @ v).permute(0, 3, 1, 2).reshape(b, n, c)
        conv_x = self.dwconv(v.reshape(b, c, h, w))
        channel_map = self.channel_interaction(to_feature_map(attended, h, w))
        spatial_map = to_tokens(self.spatial_interaction(conv_x))  # (b, n, 1)
        attended = attended * torch.sigmoid(spatial_map)
        conv_x = to_tokens(conv_x * torch.sigmoid(channel_map))
        return self.proj_drop(self.proj(attended + conv_x))


class DATB(nn.Module):
    """Dual aggregation block: spatial (even ``b_idx``) or channel attention, then the SGFN; pre-normed. With
    ``ImageLayerNorm`` as ``norm_layer`` (DAT_iLN) each residual branch is multiplied by its norm's scale."""

    def __init__(self, dim: int, num_heads: int, reso: int = 64, split_size: Sequence[int] = (2, 4),
                 shift_size: Sequence[int] = (1, 2), expansion_factor: float = 4.0, qkv_bias: bool = False,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm,
                 rg_idx: int = 0, b_idx: int = 0) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn: nn.Module
        if b_idx % 2 == 0:
            self.attn = Adaptive_Spatial_Attention(dim, num_heads=num_heads, reso=reso, split_size=split_size,
                                                   shift_size=shift_size, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                                   drop=drop, attn_drop=attn_drop, rg_idx=rg_idx, b_idx=b_idx)
        else:
            self.attn = Adaptive_Channel_Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                                   attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.ffn = SGFN(dim, int(dim * expansion_factor), dim, act_layer=act_layer)
        self.norm2 = norm_layer(dim)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        h, w = x_size
        normed, scale = pre_norm(self.norm1, x)
        x = x + rescaled(self.drop_path(self.attn(normed, h, w)), scale)
        normed, scale = pre_norm(self.norm2, x)
        return x + rescaled(self.drop_path(self.ffn(normed, h, w)), scale)


class ResidualGroup(nn.Module):
    """``depth`` DATBs, a conv on the feature map ('1conv' / '3conv') and a shortcut."""

    def __init__(self, dim: int, reso: int, num_heads: int, split_size: Sequence[int] = (2, 4),
                 expansion_factor: float = 4.0, qkv_bias: bool = False, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_paths: Sequence[float] | None = None,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm, depth: int = 2,
                 use_chk: bool = False, resi_connection: str = "1conv", rg_idx: int = 0) -> None:
        super().__init__()
        self.use_chk = use_chk
        self.reso = reso
        rates = list(drop_paths) if drop_paths is not None else [0.0] * depth
        self.blocks = nn.ModuleList([
            DATB(dim, num_heads, reso=reso, split_size=split_size, shift_size=(split_size[0] // 2, split_size[1] // 2),
                 expansion_factor=expansion_factor, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                 attn_drop=attn_drop, drop_path=rates[i], act_layer=act_layer, norm_layer=norm_layer,
                 rg_idx=rg_idx, b_idx=i)
            for i in range(depth)
        ])
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        res = x
        for blk in self.blocks:
            x = run_checkpointed(blk, x, x_size, enabled=self.use_chk)
        return res + to_tokens(self.conv(to_feature_map(x, *x_size)))


@ARCH_REGISTRY.register()
class DAT(SwinSRBase):
    """Dual Aggregation Transformer (DAT / DAT-S / DAT-2 / DAT-light by arguments).

    Args (the authors' names and defaults): img_size (training patch size; only sizes the kept mask
    buffers), in_chans, embed_dim, split_size (window height, width), depth (blocks per residual group),
    num_heads (one per group; even), expansion_factor (SGFN width), qkv_bias, qk_scale, drop_rate,
    attn_drop_rate, drop_path_rate, act_layer, norm_layer, use_chk (recompute each block in backward),
    upscale (1, 2**n or 3), img_range, resi_connection ('1conv' or '3conv'), upsampler ('pixelshuffle' or
    'pixelshuffledirect'), rgb_mean (RGB input mean, by default DIV2K's; neosr's: 0.5 each).

    DAT: embed_dim 180, depth/num_heads 6 x 6, split_size [8, 32], expansion_factor 4. DAT-S: split_size
    [8, 16], expansion_factor 2. DAT-2: DAT with expansion_factor 2. DAT-light: embed_dim 60, depth [18],
    num_heads [6], split_size [8, 32], expansion_factor 2, '3conv', 'pixelshuffledirect'.
    """

    swin_init_norms = (nn.LayerNorm, nn.BatchNorm2d, nn.GroupNorm, nn.InstanceNorm2d)
    no_weight_decay_names = frozenset()  # no absolute or tabled position bias (the bias is computed by an MLP)
    no_weight_decay_fragments = frozenset()
    pads_input = False  # the spatial attention pads inside each block
    affine_ends: ClassVar[bool] = False  # DAT_iLN: affine transforms instead of layer norms before and after the body

    def __init__(self, img_size: int = 64, in_chans: int = 3, embed_dim: int = 180, split_size: Sequence[int] = (2, 4),
                 depth: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (2, 2, 2, 2),
                 expansion_factor: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm,
                 use_chk: bool = False, upscale: int = 2, img_range: float = 1.0, resi_connection: str = "1conv",
                 upsampler: str = "pixelshuffle", rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        split_size = list(to_2tuple(split_size))
        _check_dat_args(embed_dim, split_size, depth, num_heads, upscale, resi_connection, upsampler)
        self.split_size = split_size
        self.tile_multiple: int = math.lcm(split_size[0], split_size[1])
        self.init_shallow(in_chans, embed_dim, len(depth), img_range, upscale, upsampler, rgb_mean)
        self.use_chk = use_chk
        self.before_RG = _AffineTokens(embed_dim) if self.affine_ends else nn.Sequential(_ToTokens(),
                                                                                          nn.LayerNorm(embed_dim))
        rates = drop_path_rates(drop_path_rate, sum(depth))
        self.layers = nn.ModuleList()
        for i, blocks in enumerate(depth):
            start = sum(depth[:i])
            self.layers.append(ResidualGroup(embed_dim, img_size, num_heads[i], split_size=split_size,
                                             expansion_factor=expansion_factor, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                             drop=drop_rate, attn_drop=attn_drop_rate,
                                             drop_paths=rates[start:start + blocks], act_layer=act_layer,
                                             norm_layer=norm_layer, depth=blocks, use_chk=use_chk,
                                             resi_connection=resi_connection, rg_idx=i))
        self.norm = AffineTransform(embed_dim) if self.affine_ends else norm_layer(embed_dim)
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


@ARCH_REGISTRY.register()
class DAT_iLN(DAT):  # noqa: N801 - traiNNer-redux's class name
    """DAT with i-LN (traiNNer-redux's ``DAT_iLN``; Lee et al. 2025, arXiv 2504.06629): ``ImageLayerNorm`` before
    each block's attention and SGFN (the branch rescaled by its scale), affine transforms (``AffineTransform``)
    instead of the layer norms before and after the residual groups, and no mean shift / ``img_range``. Otherwise
    DAT: the same blocks, arguments (but ``img_range``) and state-dict keys but ``before_RG.norm.*`` (DAT's
    ``before_RG.1.*``).
    """

    swin_init_norms = (nn.LayerNorm, nn.BatchNorm2d, nn.GroupNorm, nn.InstanceNorm2d, ImageLayerNorm, AffineTransform)
    affine_ends = True

    def __init__(self, img_size: int = 64, in_chans: int = 3, embed_dim: int = 180, split_size: Sequence[int] = (2, 4),
                 depth: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (2, 2, 2, 2),
                 expansion_factor: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = ImageLayerNorm,
                 use_chk: bool = False, upscale: int = 2, resi_connection: str = "1conv",
                 upsampler: str = "pixelshuffle") -> None:
        super().__init__(img_size=img_size, in_chans=in_chans, embed_dim=embed_dim, split_size=split_size, depth=depth,
                         num_heads=num_heads, expansion_factor=expansion_factor, qkv_bias=qkv_bias, qk_scale=qk_scale,
                         drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate,
                         act_layer=act_layer, norm_layer=norm_layer, use_chk=use_chk, upscale=upscale,
                         img_range=1.0, resi_connection=resi_connection, upsampler=upsampler)
        self.register_buffer("mean", torch.zeros(1, 1, 1, 1), persistent=False)  # no mean shift


def check_window_groups(family: str, split_size: Sequence[int], depth: Sequence[int], num_heads: Sequence[int],
                        upscale: int, resi_connection: str, upsampler: str,
                        upsamplers: Sequence[str] = UPSAMPLERS) -> None:
    """The argument checks DAT-style networks share (head, residual connection, windows, a head count per group)."""
    if upsampler not in upsamplers:
        raise ArchArgumentError("upsampler", f"{family}: unknown upsampler {upsampler!r}; use one of {upsamplers}")
    if resi_connection not in ("1conv", "3conv"):
        raise ArchArgumentError("resi_connection", f"{family}: unknown resi_connection {resi_connection!r}; "
                                "use '1conv' or '3conv'")
    check_upscale(upscale)
    if min(split_size) < 1:
        raise ArchArgumentError("split_size", f"{family}: split_size must be two positive integers, got {split_size}")
    if len(num_heads) != len(depth):
        raise ArchArgumentError("num_heads", f"{family}: num_heads has {len(num_heads)} entries but depth has "
                                f"{len(depth)}; give one head count per residual group")


def _check_dat_args(embed_dim: int, split_size: Sequence[int], depth: Sequence[int], num_heads: Sequence[int],
                    upscale: int, resi_connection: str, upsampler: str) -> None:
    """Refuse arguments the authors' DAT cannot run (it would fail later with a shape error)."""
    check_window_groups("DAT", split_size, depth, num_heads, upscale, resi_connection, upsampler)
    if embed_dim < 32 or embed_dim % 2:
        raise ArchArgumentError("embed_dim", f"DAT: embed_dim must be even and at least 32 (position-bias MLP "
                                f"width embed_dim/32), got {embed_dim}")
    for heads in num_heads:
        if heads < 2 or heads % 2 or embed_dim % heads:
            raise ArchArgumentError("num_heads", f"DAT: each head count must be even (half per window branch) "
                                    f"and divide embed_dim {embed_dim}; got {heads}")


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
PRESETS: dict[str, dict] = {
    "dat": {"upscale": 4, "split_size": (8, 32), "depth": (6,) * 6, "num_heads": (6,) * 6},  # 14.80 M parameters at x4
    # 11.21 M parameters at x4
    "dat_2": {"upscale": 4, "split_size": (8, 32), "depth": (6,) * 6, "num_heads": (6,) * 6, "expansion_factor": 2},
    # 21.73 M parameters at x4
    "dat_2_l": {"upscale": 4, "split_size": (8, 32), "depth": (6,) * 12, "num_heads": (6,) * 12, "expansion_factor": 2},
    # 0.88 M parameters at x4
    "dat_light": {
        "upscale": 4, "split_size": (8, 32), "depth": (18,), "embed_dim": 60, "num_heads": (6,),
        "expansion_factor": 2, "resi_connection": "3conv"
    },
    # 11.21 M parameters at x4
    "dat_s": {"upscale": 4, "split_size": (8, 16), "depth": (6,) * 6, "num_heads": (6,) * 6, "expansion_factor": 2},
}
register_presets("DAT", PRESETS, scale_arg="upscale", fixed={"unshuffle_mod": False})
# traiNNer-redux's i-LN builders: DAT's sizes (the same parameter counts), no dat_iln_2_l.
register_presets("DAT_iLN", {name.replace("dat", "dat_iln", 1): PRESETS[name] for name in ("dat", "dat_2", "dat_light",
                                                                                           "dat_s")},
                 scale_arg="upscale", fixed={"unshuffle_mod": False})

# neosr's name (tests/test_neosr_names.py checks it against the network neosr builds)
register_presets("DAT", scale_arg="upscale", source="neosr", presets={
    # 14.80 M parameters at x4
    "dat_m": {"split_size": (8, 32), "depth": (6,) * 6, "num_heads": (6,) * 6, "expansion_factor": 4.0,
              "rgb_mean": (0.5,) * 3},
})


def _recognise(s: StateShapes, entry_norm: str = "before_RG.1.weight") -> list[dict]:
    """DAT from its tensors (DAT_iLN: with ``entry_norm`` ``before_RG.norm.weight``, its affine entry transform):
    width and channels from the first conv, blocks per group, heads from the channel attention's temperature (or
    twice a spatial branch's), the window (``split_size``) from the spatial branch's index and bias rows,
    ``img_size`` from a shifted block's mask, the expansion factor, switches, the reconstruction (the two window
    orders build the same tensors: the smaller side first, as published)."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    if entry_norm not in s:
        return []
    groups = s.indices("layers.")
    branch = "layers.0.blocks.0.attn.attns.0"
    split = window_pair(s.dim(f"{branch}.relative_position_index", 0), s.dim(f"{branch}.rpe_biases", 0))
    heads = [s.dim(f"layers.{i}.blocks.1.attn.temperature", 0) if f"layers.{i}.blocks.1.attn.temperature" in s
             else 2 * s.dim(f"layers.{i}.blocks.0.attn.attns.0.pos.pos3.2.weight", 0) for i in groups]
    common = {"in_chans": cin, "embed_dim": embed, "split_size": split,
              "depth": [s.count(f"layers.{i}.blocks.") for i in groups], "num_heads": heads,
              "expansion_factor": clean(s.dim("layers.0.blocks.0.ffn.fc1.weight", 0) / embed),
              "qkv_bias": "layers.0.blocks.0.attn.qkv.bias" in s,
              "resi_connection": resi_connection(s, "conv_after_body")}
    mask = next((k for k in s.keys() if k.endswith(".attn.attn_mask_0")), None)
    if mask is not None:
        side = square_side(s.dim(mask, 0) * split[0] * split[1], mask)
        multiple = math.lcm(*split)
        common["img_size"] = PUBLISHED_IMG_SIZE if math.ceil(PUBLISHED_IMG_SIZE / multiple) * multiple == side \
            else side
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"]}
            for r in reconstruction(s, cin) if r["out"] == cin and r["upsampler"]]


register_recogniser("DAT", _recognise)
register_recogniser("DAT_iLN", lambda s: _recognise(s, entry_norm="before_RG.norm.weight"))
