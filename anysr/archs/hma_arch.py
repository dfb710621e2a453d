"""HMA: Hybrid Multi-axis Aggregation network for image super-resolution (Chu et al., CVPRW 2024), as neosr
trains it (``hma``, presets ``hma_medium`` / ``hma_large``).

HAT's skeleton (SwinIR's shallow conv, residual groups, pixel-shuffle reconstruction; the same state-dict
names there) with other blocks. Each residual group (RHTB) runs, per pair of depth steps, a fused conv block
(3x3 conv expanding 6x, layer norm, GELU, squeeze-excitation, 1x1 back) and two fused attention blocks (FAB:
window self attention, plain then shifted), then a grid attention block (GAB: a quarter of the channels in
windows, a quarter in shifted windows, half in a sparse grid attention across the whole map at
``interval_size`` strides with a dynamic position bias), added with a learned per-channel ``scale``.
Constructor arguments, module names and buffers follow neosr's code, so its weights load with ``strict=True``
and give its outputs.

Differences from neosr's code, none of which changes the output of a valid configuration:

* ``forward`` takes any height/width: it pads the input (reflect, replicate beyond) to a multiple of
  ``window_size`` and ``interval_size`` and crops; neosr's network needs such sizes (its trainer pads);
* the grid attention's relative positions come from the map's size at each call (as neosr's), computed with
  tensor ops of static shapes (one compile per input size under XLA); attention runs in the fused kernel;
* ``upsampler`` must be 'pixelshuffle' (neosr's returns the input for anything else) and ``resi_connection``
  '1conv' or 'identity'; sizes neosr cannot run are refused when building.

neosr's shifted window branch of the GAB reads its "windows" as runs of ``window_size**2`` tokens in row order
(no window partition) and rolls the result back along tokens and channels; anysr does the same, since that is
what its weights were trained with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    Mlp,
    SwinSRBase,
    block_drop_rates,
    check_swin_sr_args,
    drop_path_rates,
    relative_position_index,
    residual_conv,
    run_checkpointed,
    shifted_window_mask,
    to_2tuple,
    to_feature_map,
    to_tokens,
    window_attention,
    window_partition,
    window_reverse,
)
from anysr.archs.hitsr_arch import DynamicPosBias
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import (
    clean,
    reconstruction,
    resi_connection,
    square_side,
    window_from_index,
)
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class SEModule(nn.Module):
    """Squeeze-excitation: global mean, 1x1 conv down, SiLU, 1x1 conv up, sigmoid gate."""

    def __init__(self, channels: int, rd_channels: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=bias)
        self.act = nn.SiLU()
        self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))))


class FusedConv(nn.Module):
    """Residual conv block on tokens: layer norm, 3x3 conv to ``num_feat * expand_size``, layer norm, GELU,
    squeeze-excitation (to ``1 / attn_ratio`` of the width), 1x1 conv back."""

    def __init__(self, num_feat: int, expand_size: int = 4, attn_ratio: int = 4) -> None:
        super().__init__()
        mid = num_feat * expand_size
        self.pre_norm = nn.LayerNorm(num_feat)
        self.fused_conv = nn.Conv2d(num_feat, mid, 3, 1, 1)
        self.norm1 = nn.LayerNorm(mid)
        self.act1 = nn.GELU()
        self.se = SEModule(mid, int(mid / attn_ratio))
        self.conv3_1x1 = nn.Conv2d(mid, num_feat, 1, 1)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        y = self.fused_conv(self.pre_norm(x).view(b, h, w, c).permute(0, 3, 1, 2))
        y = self.act1(self.norm1(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        y = self.conv3_1x1(self.se(y))
        return y.permute(0, 2, 3, 1).reshape(b, h * w, c) + x


class ProjWindowAttention(nn.Module):
    """Window attention on precomputed q/k/v (the caller's ``qkv`` linear): relative-position bias table and
    output projection (``relative_position_bias_table``, ``proj``). The head width is the input's
    ``channels / 3 / num_heads``; the scale is ``(dim // num_heads) ** -0.5`` as neosr's."""

    def __init__(self, dim: int, window_size: int, num_heads: int, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, qkv: torch.Tensor, rpi: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """qkv: (windows * b, n, 3 * d * heads) -> (windows * b, n, dim)."""
        b_, n, c3 = qkv.shape
        qkv = qkv.reshape(b_, n, 3, self.num_heads, c3 // 3 // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[rpi.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        out = window_attention(qkv[0], qkv[1], qkv[2], bias, mask, scale=self.scale,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, c3 // 3)))


class FAB(nn.Module):
    """Fused attention block: layer norm, ``qkv``, (shifted-)window attention, residual; then an MLP."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.num_heads = num_heads
        self.window_size = window_size
        # A training patch of one window: no shift (as neosr does).
        self.shift_size = 0 if min(input_resolution) <= window_size else shift_size
        self.mlp_ratio = mlp_ratio
        self.norm1 = norm_layer(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn = ProjWindowAttention(dim, window_size, num_heads, qk_scale=qk_scale, attn_drop=attn_drop,
                                        proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi_sa: torch.Tensor,
                attn_mask: torch.Tensor | None) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift = self.window_size, self.shift_size
        qkv = self.qkv(self.norm1(x)).view(b, h, w, 3 * c)
        if shift:
            qkv = torch.roll(qkv, shifts=(-shift, -shift), dims=(1, 2))
        out = self.attn(window_partition(qkv, ws).reshape(-1, ws * ws, 3 * c), rpi_sa, attn_mask if shift else None)
        out = window_reverse(out.view(-1, ws, ws, c), ws, h, w)
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        x = x + self.drop_path(out.reshape(b, h * w, c))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def grid_position_index(gh: int, gw: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (dy, dx) offsets of a ``gh x gw`` grid, ((2gh-1)(2gw-1), 2) float (row offset major), and each token
    pair's row in them, (n, n). Tensor ops on the sizes only, so an ONNX trace keeps them dynamic."""
    offsets = torch.stack(torch.meshgrid(torch.arange(1 - gh, gh, device=device),
                                         torch.arange(1 - gw, gw, device=device), indexing="ij"))
    token = torch.arange(gh * gw, device=device)
    row, col = token // gw, token % gw
    index = (row[:, None] - row[None, :] + gh - 1) * (2 * gw - 1) + (col[:, None] - col[None, :] + gw - 1)
    return offsets.flatten(1).t().float(), index


class AffineTransform(nn.Module):
    """``softmax(q k^T * scale + dynamic position bias) v`` over a whole grid (neosr's name; ``pos``)."""

    def __init__(self, dim: int, num_heads: int, qk_scale: float | None = None, attn_drop: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.pos = DynamicPosBias(dim // 4, num_heads, residual=False)
        self.attn_drop = nn.Dropout(attn_drop)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                position: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        offsets, index = position
        n = index.shape[0]
        bias = self.pos(offsets)[index.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        return window_attention(q, k, v, bias, scale=self.scale,
                                dropout_p=self.attn_drop.p if self.training else 0.0)


class GridAttention(nn.Module):
    """Sparse grid attention in two steps through projected grid tokens: the grid attends to k/v, then q
    attends to the grid with that result as values (``attn_transform1``, ``attn_transform2``)."""

    def __init__(self, window_size: int, dim: int, num_heads: int, qk_scale: float | None = None,
                 attn_drop: float = 0.0) -> None:
        super().__init__()
        self.window_size = window_size
        self.dim = dim
        self.num_heads = num_heads
        self.attn_transform1 = AffineTransform(dim, num_heads, qk_scale=qk_scale, attn_drop=attn_drop)
        self.attn_transform2 = AffineTransform(dim, num_heads, qk_scale=qk_scale, attn_drop=attn_drop)

    def forward(self, qkv: torch.Tensor, grid: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
        """qkv: (groups, n, 3c), grid: (groups, n, c) -> (groups, n, c); n = gh * gw."""
        b_, n, c = grid.shape
        qkv = qkv.reshape(b_, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        grid = grid.reshape(b_, n, self.num_heads, -1).transpose(1, 2)
        position = grid_position_index(gh, gw, grid.device)
        x = self.attn_transform1(grid, qkv[1], qkv[2], position)
        x = self.attn_transform2(qkv[0], grid, x, position)
        return x.transpose(1, 2).reshape(b_, n, c)


def grid_shuffle(x: torch.Tensor, interval: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * interval**2, h/interval * w/interval, c): the pixels of each offset in the
    ``interval x interval`` cell as one group."""
    b, h, w, c = x.shape
    gh, gw = h // interval, w // interval
    return x.view(b, gh, interval, gw, interval, c).permute(0, 2, 4, 1, 3, 5).reshape(-1, gh * gw, c)


def grid_unshuffle(x: torch.Tensor, b: int, h: int, w: int, interval: int) -> torch.Tensor:
    """Inverse of ``grid_shuffle``: -> (b, h * w, c)."""
    gh, gw = h // interval, w // interval
    x = x.view(b, interval, interval, gh, gw, -1).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, h * w, -1)


class GAB(nn.Module):
    """Grid attention block: one ``qkv`` over the (unnormed) tokens feeds a window attention (a quarter of
    the output channels), a shifted one (a quarter) and the grid attention (half); ``fc`` then ``norm1`` close
    the attention, ``norm2`` the MLP (post-norm)."""

    def __init__(self, window_size: int, interval_size: int, dim: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, drop: float = 0.0, drop_path: float = 0.0,
                 mlp_ratio: float = 2.0) -> None:
        super().__init__()
        self.window_size = window_size
        self.interval_size = interval_size
        self.shift_size = window_size // 2
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.grid_proj = nn.Linear(dim, dim // 2)
        self.grid_attn = GridAttention(window_size, dim // 2, num_heads // 2, qk_scale=qk_scale,
                                       attn_drop=attn_drop)
        self.window_attn = ProjWindowAttention(dim // 4, window_size, num_heads // 2, qk_scale=qk_scale,
                                               attn_drop=attn_drop, proj_drop=drop)
        self.window_attn_s = ProjWindowAttention(dim // 4, window_size, num_heads // 2, qk_scale=qk_scale,
                                                 attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.fc = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi_sa: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift, interval = self.window_size, self.shift_size, self.interval_size
        half = c * 3 // 2
        qkv = self.qkv(x)
        grid = self.grid_proj(grid_shuffle(x.view(b, h, w, c), interval))
        grid_qkv = grid_shuffle(qkv[..., half:].reshape(b, h, w, half), interval)
        grid_out = grid_unshuffle(self.grid_attn(grid_qkv, grid, h // interval, w // interval), b, h, w, interval)
        win = qkv[..., :half].reshape(b, h, w, half)
        quarter = c * 3 // 4
        plain = self.window_attn(window_partition(win[..., :quarter], ws).reshape(-1, ws * ws, quarter), rpi_sa)
        plain = window_reverse(plain.view(-1, ws, ws, c // 4), ws, h, w).reshape(b, h * w, c // 4)
        # neosr's shifted branch: row-order runs of ws*ws tokens as windows, rolled back over tokens and channels
        rolled = torch.roll(win[..., quarter:], shifts=(-shift, -shift), dims=(1, 2))
        shifted = self.window_attn_s(rolled.reshape(-1, ws * ws, quarter), rpi_sa, mask)
        shifted = window_reverse(shifted.view(-1, ws, ws, c // 4), ws, h, w).reshape(b, h * w, c // 4)
        shifted = torch.roll(shifted, shifts=(shift, shift), dims=(1, 2))
        x = x + self.drop_path(self.norm1(self.fc(torch.cat([plain, shifted, grid_out], dim=-1))))
        return x + self.drop_path(self.norm2(self.mlp(x)))


class AttenBlocks(nn.Module):
    """One group's blocks: for each depth step a FAB (shifted on odd steps), preceded by a FusedConv on even
    steps; then ``x + gab(x) * scale``."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 interval_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.depth = depth
        self.use_checkpoint = use_checkpoint
        rates = block_drop_rates(drop_path, depth)
        blocks: list[nn.Module] = []
        for i in range(depth):
            if i % 2 == 0:
                blocks.append(FusedConv(dim, expand_size=6, attn_ratio=2))
            blocks.append(FAB(dim, input_resolution, num_heads, window_size=window_size,
                              shift_size=0 if i % 2 == 0 else window_size // 2, mlp_ratio=mlp_ratio,
                              qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                              drop_path=rates[i], norm_layer=norm_layer))
        self.blocks = nn.ModuleList(blocks)
        self.gab = GAB(window_size, interval_size, dim, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                       attn_drop=attn_drop, drop=drop, mlp_ratio=mlp_ratio)
        self.scale = nn.Parameter(torch.empty(dim))
        nn.init.trunc_normal_(self.scale, std=0.02)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], params: dict[str, torch.Tensor]) -> torch.Tensor:
        for blk in self.blocks:
            x = run_checkpointed(blk, x, x_size, params["rpi_sa"], params["attn_mask"],
                                 enabled=self.use_checkpoint)
        return x + self.gab(x, x_size, params["rpi_sa"], params["attn_mask"]) * self.scale


class RHTB(nn.Module):
    """Residual hybrid transformer block: AttenBlocks, a conv on the map ('1conv' / 'identity'), shortcut."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 interval_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 resi_connection: str = "1conv") -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = AttenBlocks(dim, input_resolution, depth, num_heads, window_size, interval_size,
                                          mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                                          attn_drop=attn_drop, drop_path=drop_path, norm_layer=norm_layer,
                                          use_checkpoint=use_checkpoint)
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], params: dict[str, torch.Tensor]) -> torch.Tensor:
        return to_tokens(self.conv(to_feature_map(self.residual_group(x, x_size, params), *x_size))) + x


@ARCH_REGISTRY.register()
class HMA(SwinSRBase):
    """Hybrid Multi-axis Aggregation network (neosr's ``hma``; presets ``hma_medium``, ``hma_large``).

    Args (neosr's names and defaults, except ``upscale``: neosr takes its option file's scale): img_size
    (training patch size: decides whether FABs shift and the ``absolute_pos_embed`` size), patch_size,
    in_chans, embed_dim (divisible by 4 and by ``num_heads``), depths, num_heads (even, one per group),
    window_size, interval_size (the grid attention's stride), mlp_ratio, qkv_bias, qk_scale, drop_rate,
    attn_drop_rate, drop_path_rate, norm_layer, ape, patch_norm, use_checkpoint (recompute each block in
    backward), upscale (1, 2**n or 3), img_range, upsampler ('pixelshuffle'), resi_connection ('1conv' or
    'identity'). The input is shifted by 0.5 per RGB channel (neosr's mean).

    hma_medium: embed_dim 180, 6 groups of depth 6 and 6 heads, window 16, img_size 64;
    hma_large: 12 groups, window 24, img_size 48.
    """

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 60, depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 8, interval_size: int = 4, mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 4, img_range: float = 1.0,
                 upsampler: str = "pixelshuffle", resi_connection: str = "1conv") -> None:
        super().__init__()
        _check_hma_args(img_size, patch_size, embed_dim, depths, num_heads, window_size, interval_size, upscale,
                        upsampler, resi_connection)
        self.window_size = window_size
        self.interval_size = interval_size
        self.shift_size = window_size // 2
        self.tile_multiple: int = math.lcm(window_size, interval_size)
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler)
        self.mean = torch.full((1, 3, 1, 1), 0.5) if in_chans == 3 else torch.zeros(1, 1, 1, 1)  # neosr's
        self.register_buffer("relative_position_index_SA", relative_position_index(window_size))
        self.mlp_ratio = mlp_ratio
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, norm_layer, patch_norm, ape, drop_rate)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RHTB(embed_dim, resolution, depth, num_heads[i], window_size, interval_size,
                                    mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate,
                                    attn_drop=attn_drop_rate, drop_path=rates[start:start + depth],
                                    norm_layer=norm_layer, use_checkpoint=use_checkpoint,
                                    resi_connection=resi_connection))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale)
        self.init_swin_weights()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The attention body on a (b, embed_dim, h, w) map whose sides are multiples of ``tile_multiple``."""
        x_size = (x.shape[2], x.shape[3])
        params = {
            "attn_mask": shifted_window_mask(x_size[0], x_size[1], self.window_size, self.shift_size, x.device,
                                             x.dtype),
            "rpi_sa": self.relative_position_index_SA,
        }
        x = self.embed_tokens(x)
        for layer in self.layers:
            x = layer(x, x_size, params)
        return to_feature_map(self.norm(x), *x_size)


def _check_hma_args(img_size: int | Sequence[int], patch_size: int | Sequence[int], embed_dim: int,
                    depths: Sequence[int], num_heads: Sequence[int], window_size: int, interval_size: int,
                    upscale: int, upsampler: str, resi_connection: str) -> None:
    """Refuse arguments neosr's HMA cannot run (it fails later, or silently skips the reconstruction)."""
    check_swin_sr_args("HMA", depths, num_heads, window_size, upscale, upsampler, resi_connection)
    if window_size < 2:
        raise ArchArgumentError("window_size", f"HMA: window_size must be at least 2, got {window_size}")
    if not isinstance(interval_size, int) or interval_size < 1:
        raise ArchArgumentError("interval_size", f"HMA: interval_size must be a positive integer, got "
                                f"{interval_size!r}")
    if embed_dim % 4:
        raise ArchArgumentError("embed_dim", f"HMA: embed_dim must be divisible by 4 (the grid attention block "
                                f"splits it in quarters), got {embed_dim}")
    for heads in num_heads:
        if heads < 2 or heads % 2 or embed_dim % heads or (embed_dim // 4) % (heads // 2):
            raise ArchArgumentError("num_heads", f"HMA: each head count must be even, divide embed_dim "
                                    f"{embed_dim}, and its half divide embed_dim / 4; got {heads}")
    img, patch = to_2tuple(img_size), to_2tuple(patch_size)
    if min(img[0] // patch[0], img[1] // patch[1]) < window_size:
        raise ArchArgumentError("img_size", f"HMA: img_size {img_size} (in patches) must be at least window_size "
                                f"{window_size}; neosr builds mismatched position tables otherwise")


__all__ = ["FAB", "GAB", "HMA", "RHTB", "FusedConv", "GridAttention", "grid_shuffle", "grid_unshuffle"]


register_presets("HMA", scale_arg="upscale", source="neosr", presets={
    "hma": {},  # neosr's name: the class defaults, the top-level scale
    # 69.87 M parameters at x4 (as neosr builds it)
    "hma_medium": {"img_size": 64, "window_size": 16, "depths": (6,) * 6, "embed_dim": 180, "num_heads": (6,) * 6},
    # 139.67 M parameters at x4
    "hma_large": {"img_size": 48, "window_size": 24, "depths": (6,) * 12, "embed_dim": 180,
                  "num_heads": (6,) * 12},
})


def _recognise(s: StateShapes) -> list[dict]:
    """HMA from its tensors: width and channels from the first conv, depth per group from its fused attention
    blocks, heads from each group's first FAB table, the window from the index buffer, the MLP ratio, switches,
    the reconstruction. ``interval_size`` changes no shape (neosr's default 4 is proposed); ``img_size`` shows
    only with ``ape``."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    s.shape("layers.0.residual_group.gab.grid_proj.weight")
    groups = s.indices("layers.")
    prefix = "layers.{}.residual_group.blocks."
    depths = [sum(f"{prefix.format(i)}{j}.qkv.weight" in s for j in s.indices(prefix.format(i))) for i in groups]
    block = "layers.0.residual_group.blocks.1"
    ape = "absolute_pos_embed" in s
    common = {"in_chans": cin, "embed_dim": embed, "depths": depths,
              "num_heads": [s.dim(f"{prefix.format(i)}1.attn.relative_position_bias_table", 1) for i in groups],
              "window_size": window_from_index(s, "relative_position_index_SA"),
              "mlp_ratio": clean(s.dim(f"{block}.mlp.fc1.weight", 0) / embed),
              "qkv_bias": f"{block}.qkv.bias" in s, "ape": ape, "patch_norm": "patch_embed.norm.weight" in s,
              "resi_connection": resi_connection(s, "conv_after_body")}
    if ape:
        common["img_size"] = square_side(s.dim("absolute_pos_embed", 1), "absolute_pos_embed")
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"]}
            for r in reconstruction(s, cin) if r["out"] == cin]


register_recogniser("HMA", _recognise)
