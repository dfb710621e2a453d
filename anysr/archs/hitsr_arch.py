"""HiT-SR: Hierarchical Transformer for efficient image super-resolution (Zhang, Zhang and Yu, ECCV 2024).

Three networks share one SwinIR-like body (residual groups of transformer blocks, a 3x3 conv after each) and
differ in the block's token mixer or feed-forward part:

* ``HiT_SIR``: spatial-channel correlation (SCC) in windows that grow through each group (``hier_win_ratios``
  times ``base_win_size``: 4, 8, 16, 32, 48, 64 pixels by default), with an MLP;
* ``HiT_SNG``: the same, with SRFormer's N-gram context (a bidirectional 2x2 sliding-window attention over
  window summaries) added to every window before the correlation;
* ``HiT_SRF``: SIR's mixer with a convolutional feed-forward network (a 5x5 depth-wise conv inside).

SCC has no softmax: a spatial branch correlates every pixel with the window's values linearly pooled to
``base_win_size`` cells (plus a dynamic relative-position bias averaged over each cell), a channel branch
correlates channels over the window. Module names and constructor arguments follow the authors' code (as in
traiNNer-redux), so released checkpoints load with ``strict=True`` and give the same output.

Size: any input. Each block reflect-pads its map at the bottom / right to its window size (SNG: twice it)
and crops back, as the authors' code does; where one reflection is not enough, it reflects again (the
authors' code stops with an error there for SIR, and for SNG / SRF where two reflections are not enough; a
one-pixel side is replicated). Every block pads for itself, so tiles of any size run the
same network (``tile_multiple`` 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    Mlp,
    check_upscale,
    nearest_upsample,
    relative_position_index,
    rgb_mean_of,
    run_checkpointed,
    swin_init_weights,
    to_2tuple,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import clean, reconstruction, resi_connection, square_side
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

DEFAULT_BASE_WINDOW = (8, 8)  # the published base window and hierarchical window ratios
DEFAULT_RATIOS = (0.5, 1, 2, 4, 6, 8)

Pair = tuple[int, int]


def _reflect_grow(x: torch.Tensor, dim: int, pad: int, first_full: bool) -> torch.Tensor:
    """Add ``pad`` reflected rows (``dim`` -2) or columns (-1) at the end, in steps of at most side - 1.
    ``first_full``: SNG / SRF's first step reflects side - 1 whenever one step cannot reach ``pad``. The
    first F.pad is always applied (a pad of 0 included), so a traced graph pads at every size. A side of one
    pixel is replicated (nothing to reflect)."""
    while True:
        side = x.shape[dim]
        if side == 1:
            return F.pad(x, (0, pad, 0, 0) if dim == -1 else (0, 0, 0, pad), mode="replicate")
        step = side - 1 if first_full and pad >= side else min(pad, side - 1)
        x = F.pad(x, (0, step, 0, 0) if dim == -1 else (0, 0, 0, step), mode="reflect")
        pad = pad - step
        first_full = False
        if not pad > 0:
            return x


def _pad_map(x: torch.Tensor, multiple: Pair, first_full: bool) -> torch.Tensor:
    """Reflect-pad an NCHW map at the bottom / right to multiples of ``multiple``."""
    h, w = x.shape[-2:]
    x = _reflect_grow(x, -2, (-h) % multiple[0], first_full)
    return _reflect_grow(x, -1, (-w) % multiple[1], first_full)


def _to_windows(x: torch.Tensor, win: Pair) -> torch.Tensor:
    """(b, c, h, w) -> (b * nh * nw, wh * ww, c), windows in row-major order."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // win[0], win[0], w // win[1], win[1])
    return x.permute(0, 2, 4, 3, 5, 1).reshape(-1, win[0] * win[1], c)


def _from_windows(x: torch.Tensor, win: Pair, h: int, w: int) -> torch.Tensor:
    """Inverse of ``_to_windows``: (b * nh * nw, wh * ww, c) -> (b, c, h, w)."""
    nh, nw = h // win[0], w // win[1]
    c = x.shape[-1]
    x = x.reshape(-1, nh, nw, win[0], win[1], c)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(-1, c, h, w)


class DFE(nn.Module):
    """Dual feature extraction: a 1x1-3x3-1x1 conv branch (1/5 of the channels inside) times a 1x1 conv."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        mid = in_features // 5
        self.out_features = out_features
        self.conv = nn.Sequential(nn.Conv2d(in_features, mid, 1), nn.LeakyReLU(0.2, inplace=True),
                                  nn.Conv2d(mid, mid, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                                  nn.Conv2d(mid, out_features, 1))
        self.linear = nn.Conv2d(in_features, out_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # NCHW -> NCHW
        return self.conv(x) * self.linear(x)


class DynamicPosBias(nn.Module):
    """Relative-position bias from an MLP over the (dy, dx) offsets (CrossFormer's dynamic position bias)."""

    def __init__(self, dim: int, num_heads: int, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.num_heads = num_heads
        self.pos_dim = dim // 4
        self.pos_proj = nn.Linear(2, self.pos_dim)

        def stage(out: int) -> nn.Sequential:
            return nn.Sequential(nn.LayerNorm(self.pos_dim), nn.ReLU(inplace=True), nn.Linear(self.pos_dim, out))

        self.pos1 = stage(self.pos_dim)
        self.pos2 = stage(self.pos_dim)
        self.pos3 = stage(num_heads)

    def forward(self, offsets: torch.Tensor) -> torch.Tensor:
        pos = self.pos_proj(offsets)
        if self.residual:
            pos = pos + self.pos1(pos)
            pos = pos + self.pos2(pos)
            return self.pos3(pos)
        return self.pos3(self.pos2(self.pos1(pos)))


class NGramWindowAttention(nn.Module):
    """Multi-head self-attention over an ``window_size`` patch of tokens with a learned relative-position bias."""

    def __init__(self, dim: int, window_size: Pair, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        bias = bias.view(n, n, self.num_heads).permute(2, 0, 1).unsqueeze(0).to(q.dtype)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class NGramContext(nn.Module):
    """Bidirectional N-gram context (N = 2): each window's summary (a strided conv over channel pairs) attends
    to its 2x2 neighbourhood forwards (down / right) and backwards (up / left), reflect-padded at the border;
    the two averaged results are merged by a 1x1 conv. Returns (b, c, nh, nw)."""

    def __init__(self, dim: int, window_size: int | Pair, ngram: int, ngram_num_heads: int) -> None:
        super().__init__()
        if ngram != 2:
            raise ArchArgumentError("ngram", f"anysr's NGramContext is built for ngram 2 (HiT-SNG's), got {ngram}")
        self.dim = dim
        self.window_size = to_2tuple(window_size)
        self.ngram = ngram
        self.unigram_embed = nn.Conv2d(2, 1, kernel_size=self.window_size, stride=self.window_size)
        self.ngram_attn = NGramWindowAttention(dim // 2, (ngram, ngram), ngram_num_heads)
        self.merge = nn.Conv2d(dim, dim, 1)

    def _neighbourhood(self, unigram: torch.Tensor, nh: int, nw: int) -> torch.Tensor:
        """Mean of the attention over each window's 2x2 neighbourhood of a padded (b, c, nh+1, nw+1) map."""
        b, c = unigram.shape[:2]
        n = self.ngram
        grams = torch.stack([unigram[:, :, i:i + nh, j:j + nw] for i in range(n) for j in range(n)], dim=-1)
        grams = grams.permute(0, 2, 3, 4, 1).reshape(b * nh * nw, n * n, c)
        ctx = self.ngram_attn(grams).mean(1)
        return ctx.view(b, nh, nw, c).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d, h, w = x.shape
        nh, nw = h // self.window_size[0], w // self.window_size[1]
        unigram = self.unigram_embed(x.reshape(b * (d // 2), 2, h, w)).view(b, d // 2, nh, nw)
        forward = self._neighbourhood(F.pad(unigram, (0, 1, 0, 1), mode="reflect"), nh, nw)
        backward = self._neighbourhood(F.pad(unigram, (1, 0, 1, 0), mode="reflect"), nh, nw)
        return self.merge(torch.cat([forward, backward], 1))


class NGramWindowPartition(nn.Module):
    """Window partition with the N-gram context of each window added to all its pixels."""

    def __init__(self, dim: int, window_size: Pair, ngram: int, ngram_num_heads: int) -> None:
        super().__init__()
        self.window_size = window_size
        self.ngram_context = NGramContext(dim, window_size, ngram, ngram_num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, c, h, w) -> (b * windows, wh * ww, c)
        context = self.ngram_context(x)
        return _to_windows(x, self.window_size) + context.permute(0, 2, 3, 1).reshape(-1, 1, x.shape[1])


class SCC(nn.Module):
    """Spatial-channel correlation in ``window_size`` windows (input and output NCHW, sides multiples of it).

    The features are projected (DFE) to queries and values, split into ``num_heads`` heads. Spatial branch:
    each query is correlated (no softmax) with the values linearly pooled to ``base_win_size`` cells, plus a
    dynamic position bias averaged over each cell. Channel branch: one head, a channels-by-channels correlation
    over the window. ``ngram``: HiT-SNG's N-gram context before the split.
    """

    def __init__(self, dim: int, base_win_size: Pair, window_size: Pair, num_heads: int, value_drop: float = 0.0,
                 proj_drop: float = 0.0, ngram: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.qv = DFE(dim, dim)  # the network checks that dim is a multiple of 2 * num_heads
        self.proj = nn.Linear(dim, dim)
        self.value_drop = nn.Dropout(value_drop)
        self.proj_drop = nn.Dropout(proj_drop)
        self.base_win_size = (min(window_size[0], base_win_size[0]), min(window_size[1], base_win_size[1]))
        self.scale = dim // (2 * num_heads)
        cells = self.base_win_size[0] * self.base_win_size[1]
        self.spatial_linear = nn.Linear(window_size[0] * window_size[1] // cells, 1)
        self.pos = DynamicPosBias(dim // 4, num_heads, residual=False)
        if ngram:
            self.ngram_window_partition = NGramWindowPartition(dim, window_size, 2, num_heads)

    def _position_bias(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(heads, wh*ww, cells): the dynamic bias of each query / key offset, averaged over each cell's keys."""
        (wh, ww), (ch, cw) = self.window_size, self.base_win_size
        sh, sw = wh // ch, ww // cw
        dy = torch.arange(1 - wh, wh, device=device, dtype=dtype)
        dx = torch.arange(1 - ww, ww, device=device, dtype=dtype)
        offsets = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), -1).reshape(-1, 2)
        table = self.pos(offsets).transpose(0, 1).reshape(1, self.num_heads, 2 * wh - 1, 2 * ww - 1)
        # the mean over a cell's sh x sw keys of table[qy - ky + wh-1, qx - kx + ww-1] is one entry of the
        # table box-averaged over sh x sw: at row qy - cell_y * sh + wh - sh (columns alike)
        boxed = F.avg_pool2d(table, (sh, sw), stride=1).flatten(2)[0]  # (heads, (2wh-sh) * (2ww-sw))
        qy = torch.arange(wh, device=device).view(wh, 1, 1, 1)
        qx = torch.arange(ww, device=device).view(1, ww, 1, 1)
        cy = torch.arange(ch, device=device).view(1, 1, ch, 1)
        cx = torch.arange(cw, device=device).view(1, 1, 1, cw)
        index = (qy - cy * sh + wh - sh) * (2 * ww - sw) + (qx - cx * sw + ww - sw)
        return boxed[:, index.reshape(-1)].view(self.num_heads, wh * ww, ch * cw)

    def _pool_values(self, v: torch.Tensor) -> torch.Tensor:
        """(b, heads, wh*ww, d) -> (b, heads, cells, d): each cell's values through ``spatial_linear``."""
        b, heads, _, d = v.shape
        (wh, ww), (ch, cw) = self.window_size, self.base_win_size
        v = v.reshape(b, heads, ch, wh // ch, cw, ww // cw, d).permute(0, 1, 2, 4, 6, 3, 5)
        return self.spatial_linear(v.reshape(b, heads, ch * cw, d, -1)).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        qv = self.qv(x)
        if hasattr(self, "ngram_window_partition"):
            qv = self.ngram_window_partition(qv)
        else:
            qv = _to_windows(qv, self.window_size)
        b, n, c = qv.shape
        q, v = qv.view(b, n, 2, self.num_heads, c // (2 * self.num_heads)).permute(2, 0, 3, 1, 4)

        pooled = self._pool_values(v)
        corr = q @ pooled.transpose(-2, -1) / self.scale + self._position_bias(x.device, q.dtype)
        spatial = (corr @ self.value_drop(pooled)).transpose(1, 2).reshape(b, n, c // 2)

        q1 = q.transpose(1, 2).reshape(b, n, c // 2)
        v1 = v.transpose(1, 2).reshape(b, n, c // 2)
        channel_corr = q1.transpose(-2, -1) @ v1 / n
        channel = (channel_corr @ self.value_drop(v1).transpose(-2, -1)).transpose(-2, -1)

        out = _from_windows(torch.cat([spatial, channel], -1), self.window_size, h, w)
        return self.proj_drop(self.proj(out.permute(0, 2, 3, 1)))  # (b, h, w, dim)


class ConvFFN(nn.Module):
    """Linear - GELU - (+ 5x5 depth-wise conv - GELU residual) - dropout - linear - dropout (HiT-SRF)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.dwconv = _DWConv(hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, size: Pair) -> torch.Tensor:
        x = self.act(self.fc1(x))
        x = x + self.dwconv(x, size)
        return self.drop(self.fc2(self.drop(x)))


class _DWConv(nn.Module):
    """A 5x5 depth-wise conv and GELU on a token sequence (the map's size given)."""

    def __init__(self, hidden_features: int) -> None:
        super().__init__()
        self.hidden_features = hidden_features
        self.depthwise_conv = nn.Sequential(
            nn.Conv2d(hidden_features, hidden_features, 5, 1, 2, groups=hidden_features), nn.GELU())

    def forward(self, x: torch.Tensor, size: Pair) -> torch.Tensor:
        b, n, c = x.shape
        y = self.depthwise_conv(x.transpose(1, 2).reshape(b, c, size[0], size[1]))
        return y.flatten(2).transpose(1, 2)


class HierarchicalTransformerBlock(nn.Module):
    """Post-norm transformer block: ``x + norm1(scc(x))``, then ``+ norm2(ffn(x))``; the map is reflect-padded
    to the window multiple (``pad_factor`` times the window) for the correlation and cropped back."""

    def __init__(self, dim: int, num_heads: int, base_win_size: Pair, window_size: Pair, mlp_ratio: float,
                 drop: float, value_drop: float, drop_path: float, variant: str) -> None:
        super().__init__()
        self.window_size = window_size
        self.variant = variant
        self.pad_multiple = (2 * window_size[0], 2 * window_size[1]) if variant == "SNG" else window_size
        self.norm1 = nn.LayerNorm(dim)
        self.correlation = SCC(dim, base_win_size, window_size, num_heads, value_drop, drop, ngram=variant == "SNG")
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = ConvFFN(dim, hidden, drop=drop) if variant == "SRF" else Mlp(dim, hidden, drop=drop)

    def forward(self, x: torch.Tensor, size: Pair) -> torch.Tensor:
        h, w = size
        b, n, c = x.shape
        y = _pad_map(x.transpose(1, 2).reshape(b, c, h, w), self.pad_multiple, first_full=self.variant != "SIR")
        y = self.correlation(y)[:, :h, :w].reshape(b, n, c)
        x = x + self.drop_path(self.norm1(y))
        ffn = self.mlp(x, size) if self.variant == "SRF" else self.mlp(x)
        return x + self.drop_path(self.norm2(ffn))


class BasicLayer(nn.Module):
    """``depth`` blocks whose windows are ``base_win_size`` times ``hier_win_ratios[i]``."""

    def __init__(self, dim: int, depth: int, num_heads: int, base_win_size: Pair, mlp_ratio: float, drop: float,
                 value_drop: float, drop_path: list[float], use_checkpoint: bool, hier_win_ratios: Sequence[float],
                 variant: str) -> None:
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList()
        for i in range(depth):
            win = (int(base_win_size[0] * hier_win_ratios[i]), int(base_win_size[1] * hier_win_ratios[i]))
            if win[0] > base_win_size[0] and win[1] > base_win_size[1] and (
                    win[0] % base_win_size[0] or win[1] % base_win_size[1]):
                raise ArchArgumentError("hier_win_ratios", f"window {win} (ratio {hier_win_ratios[i]}) is larger "
                                        f"than base_win_size {base_win_size} but not a multiple of it")
            self.blocks.append(HierarchicalTransformerBlock(dim, num_heads, base_win_size, win, mlp_ratio, drop,
                                                            value_drop, drop_path[i], variant))

    def forward(self, x: torch.Tensor, size: Pair) -> torch.Tensor:
        for blk in self.blocks:
            x = run_checkpointed(blk, x, size, enabled=self.use_checkpoint)
        return x


def _residual_conv(dim: int, resi_connection: str) -> nn.Module:
    if resi_connection == "1conv":
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if resi_connection == "3conv":
        return nn.Sequential(nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                             nn.Conv2d(dim // 4, dim // 4, 1), nn.LeakyReLU(0.2, inplace=True),
                             nn.Conv2d(dim // 4, dim, 3, 1, 1))
    raise ArchArgumentError("resi_connection", f"must be '1conv' or '3conv', got {resi_connection!r}")


class RHTB(nn.Module):
    """Residual hierarchical transformer group: the blocks, a conv on the map, plus the group's input."""

    def __init__(self, dim: int, resi_connection: str, **layer_args: object) -> None:
        super().__init__()
        self.residual_group = BasicLayer(dim=dim, **layer_args)  # type: ignore[arg-type]
        self.conv = _residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, size: Pair) -> torch.Tensor:
        y = self.residual_group(x, size)
        b, n, c = y.shape
        y = self.conv(y.transpose(1, 2).reshape(b, c, size[0], size[1]))
        return y.flatten(2).transpose(1, 2) + x


class PatchEmbed(nn.Module):
    """Map to tokens, with the optional layer norm (``norm`` is the only state)."""

    def __init__(self, embed_dim: int, norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim) if norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)
        return self.norm(x) if self.norm is not None else x


class _HiT(nn.Module):
    """The body HiT_SIR, HiT_SNG and HiT_SRF share (see the module docstring; ``rgb_mean``: the RGB input mean, by
    default DIV2K's, neosr's 0.5 each)."""

    variant = ""
    tile_multiple: int = 1

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 60, depths: Sequence[int] | None = None, num_heads: Sequence[int] | None = None,
                 base_win_size: Sequence[int] | None = None, mlp_ratio: float = 2.0, drop_rate: float = 0.0,
                 value_drop_rate: float = 0.0, drop_path_rate: float = 0.0, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 4, img_range: float = 1.0,
                 upsampler: str | None = "pixelshuffledirect", resi_connection: str = "1conv",
                 hier_win_ratios: Sequence[float] | None = None, expansion_factor: float | None = None,
                 rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        depths = list(depths if depths is not None else (6, 6, 6, 6))
        num_heads = list(num_heads if num_heads is not None else (6, 6, 6, 6))
        base = to_2tuple(base_win_size if base_win_size is not None else DEFAULT_BASE_WINDOW)
        ratios = list(hier_win_ratios if hier_win_ratios is not None else DEFAULT_RATIOS)
        check_upscale(upscale)
        if expansion_factor is not None and expansion_factor != mlp_ratio:
            raise ArchArgumentError("expansion_factor", f"the authors' {type(self).__name__} ignores it (their MLP "
                                    f"width is mlp_ratio, {mlp_ratio}); set mlp_ratio instead")
        if len(num_heads) != len(depths):
            raise ArchArgumentError("num_heads", f"needs one entry per group ({len(depths)}), got {num_heads}")
        if any(d > len(ratios) for d in depths):
            raise ArchArgumentError("depths", f"a group has at most len(hier_win_ratios) = {len(ratios)} blocks")
        if embed_dim < 16 or any(embed_dim % (2 * h) for h in num_heads):
            raise ArchArgumentError("embed_dim", f"must be at least 16 and a multiple of 2 * num_heads, got "
                                    f"{embed_dim} with num_heads {num_heads}")
        if upsampler == "nearest+conv" and upscale != 4:
            raise ArchArgumentError("upsampler", "'nearest+conv' supports upscale 4 only")
        num_feat = 64
        self.img_range = img_range
        self.upscale = upscale
        self.upsampler = upsampler
        self.base_win_size = base
        self.mean: torch.Tensor
        self.register_buffer("mean", torch.tensor(rgb_mean_of(rgb_mean)).view(1, 3, 1, 1) if in_chans == 3
                             else torch.zeros(1, 1, 1, 1), persistent=False)

        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)
        self.ape = ape
        self.patch_embed = PatchEmbed(embed_dim, patch_norm)
        if ape:
            img, patch = to_2tuple(img_size), to_2tuple(patch_size)
            patches = (img[0] // patch[0]) * (img[1] // patch[1])
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, patches, embed_dim))
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self.pos_drop = nn.Dropout(drop_rate)
        total = sum(depths)
        dpr = [drop_path_rate * i / (total - 1) if total > 1 else 0.0 for i in range(total)]
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RHTB(embed_dim, resi_connection, depth=depth, num_heads=num_heads[i],
                                    base_win_size=base, mlp_ratio=mlp_ratio, drop=drop_rate,
                                    value_drop=value_drop_rate, drop_path=dpr[start:start + depth],
                                    use_checkpoint=use_checkpoint, hier_win_ratios=ratios, variant=self.variant))
        self.norm = nn.LayerNorm(embed_dim)
        self.conv_after_body = _residual_conv(embed_dim, resi_connection)

        if upsampler == "pixelshuffle":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            ups: list[nn.Module] = []
            if upscale & (upscale - 1) == 0:
                for _ in range(int(math.log2(upscale))):
                    ups += [nn.Conv2d(num_feat, 4 * num_feat, 3, 1, 1), nn.PixelShuffle(2)]
            elif upscale == 3:
                ups += [nn.Conv2d(num_feat, 9 * num_feat, 3, 1, 1), nn.PixelShuffle(3)]
            else:
                raise ArchArgumentError("upscale", f"'pixelshuffle' supports 2^n and 3, got {upscale}")
            self.upsample = nn.Sequential(*ups)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
        elif upsampler == "pixelshuffledirect":
            self.upsample = nn.Sequential(nn.Conv2d(embed_dim, upscale * upscale * in_chans, 3, 1, 1),
                                          nn.PixelShuffle(upscale))
        elif upsampler == "nearest+conv":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(0.2, inplace=True)
        elif upsampler in (None, "", "none"):
            if upscale != 1:
                raise ArchArgumentError("upsampler", f"no upsampler means upscale 1, got upscale {upscale}")
            self.conv_last = nn.Conv2d(embed_dim, in_chans, 3, 1, 1)
        else:
            raise ArchArgumentError("upsampler", "must be 'pixelshuffle', 'pixelshuffledirect', 'nearest+conv' or "
                                    f"none, got {upsampler!r}")
        self.apply(swin_init_weights)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.patch_embed(x)
        if self.ape:
            t = t + self.absolute_pos_embed
        t = self.pos_drop(t)
        for layer in self.layers:
            t = layer(t, (h, w))
        return self.norm(t).transpose(1, 2).reshape(b, c, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(x.dtype)
        x = (x - mean) * self.img_range
        if self.upsampler in (None, "", "none"):
            first = self.conv_first(x)
            x = x + self.conv_last(self.conv_after_body(self.forward_features(first)) + first)
            return x / self.img_range + mean
        x = self.conv_first(x)
        x = self.conv_after_body(self.forward_features(x)) + x
        if self.upsampler == "pixelshuffledirect":
            x = self.upsample(x)
        elif self.upsampler == "pixelshuffle":
            x = self.conv_last(self.upsample(self.conv_before_upsample(x)))
        else:
            x = self.conv_before_upsample(x)
            x = self.lrelu(self.conv_up1(nearest_upsample(x, 2)))
            x = self.lrelu(self.conv_up2(nearest_upsample(x, 2)))
            x = self.conv_last(self.lrelu(self.conv_hr(x)))
        return x / self.img_range + mean


@ARCH_REGISTRY.register()
class HiT_SIR(_HiT):  # noqa: N801 (the authors' name)
    """HiT-SIR: spatial-channel correlation and an MLP in every block."""

    variant = "SIR"


@ARCH_REGISTRY.register()
class HiT_SNG(_HiT):  # noqa: N801
    """HiT-SNG: SIR with the N-gram context added to each window; its blocks pad to twice the window."""

    variant = "SNG"


@ARCH_REGISTRY.register()
class HiT_SRF(_HiT):  # noqa: N801
    """HiT-SRF: SIR with a convolutional feed-forward network (5x5 depth-wise conv) in every block."""

    variant = "SRF"


# traiNNer-redux's builders (hit_sir, hit_sng, hit_srf) build the classes' defaults (their expansion_factor=2
# is swallowed by the classes; anysr accepts it when it equals mlp_ratio)
for _cls in ("HiT_SIR", "HiT_SNG", "HiT_SRF"):
    register_presets(_cls, scale_arg="upscale", presets={_cls.lower(): {}})  # x4: 791,540 / 1,032,060 / 866,420

# neosr's names (tests/test_neosr_names.py checks them against the networks neosr builds)
register_presets("HiT_SRF", scale_arg="upscale", source="neosr", presets={
    # 10.75 M parameters at x4
    "hit_srf_medium": {"img_size": 48, "base_win_size": (16, 16), "depths": (6,) * 6, "embed_dim": 180,
                       "num_heads": (6,) * 6, "upsampler": "pixelshuffle",
                       "rgb_mean": (0.5,) * 3},
    # 20.81 M parameters at x4
    "hit_srf_large": {"img_size": 48, "base_win_size": (24, 24), "depths": (6,) * 12, "embed_dim": 180,
                      "num_heads": (6,) * 12, "upsampler": "pixelshuffle",
                      "rgb_mean": (0.5,) * 3},
})


def _recognise(variant: str) -> Callable[[StateShapes], list[dict]]:
    """The recogniser of one HiT variant: width and channels from the first conv, blocks per group, heads from
    the dynamic position bias, the MLP ratio, the window ratios above 1 from each block's spatial linear (a
    ``ratio**2``-wide input; ratios up to 1 and the base window show in no tensor but HiT-SNG's context conv, so the
    published 8 x 8 and 0.5 / 1 are kept), switches, the reconstruction. The variants' layouts differ (SNG: the
    N-gram context, SRF: the ConvFFN's depth-wise conv), so only one builds a file's tensors."""

    def recognise(s: StateShapes) -> list[dict]:
        embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
        groups = s.indices("layers.")
        if not groups:
            return []
        first = "layers.0.residual_group.blocks.0"
        if ("ngram_window_partition" in " ".join(k for k in s.keys() if k.startswith(first))) != (variant == "SNG"):
            return []
        if (f"{first}.mlp.dwconv.depthwise_conv.0.weight" in s) != (variant == "SRF"):
            return []
        depths = [s.count(f"layers.{i}.residual_group.blocks.") for i in groups]
        blocks = range(max(depths))
        owner = [next(i for i, d in zip(groups, depths, strict=True) if d > b) for b in blocks]
        cells = [s.dim(f"layers.{g}.residual_group.blocks.{b}.correlation.spatial_linear.weight", 1)
                 for b, g in zip(blocks, owner, strict=True)]
        base = list(DEFAULT_BASE_WINDOW)
        ratios: list[float] = list(DEFAULT_RATIOS)
        if variant == "SNG":  # each block's context conv has its window as kernel: find the base that explains them
            context = "correlation.ngram_window_partition.ngram_context.unigram_embed.weight"
            wins = [s.dim(f"layers.{g}.residual_group.blocks.{b}.{context}", 2) for b, g in zip(blocks, owner,
                                                                                                  strict=True)]
            for side in dict.fromkeys((DEFAULT_BASE_WINDOW[0], 2 * wins[0], wins[0])):
                if all((w // min(w, side)) ** 2 == c for w, c in zip(wins, cells, strict=True)):
                    base = [side, side]
                    ratios[:len(wins)] = [clean(w / side) for w in wins]
                    break
        else:  # windows above the base show as ratio**2 cells; those up to it in no tensor (published kept)
            for b, c in enumerate(cells):
                if b >= len(ratios) or max(1, ratios[b] ** 2) != c:
                    ratios[b:b + 1] = [clean(math.sqrt(c))]
        common = {"in_chans": cin, "embed_dim": embed, "depths": depths,
                  "num_heads": [s.dim(f"layers.{i}.residual_group.blocks.0.correlation.pos.pos3.2.weight", 0)
                                for i in groups],
                  "base_win_size": base, "hier_win_ratios": ratios,
                  "mlp_ratio": clean(s.dim(f"{first}.mlp.fc1.weight", 0) / embed),
                  "ape": "absolute_pos_embed" in s, "patch_norm": "patch_embed.norm.weight" in s,
                  "resi_connection": resi_connection(s, "conv_after_body")}
        if common["ape"]:
            common["img_size"] = square_side(s.dim("absolute_pos_embed", 1), "absolute_pos_embed")
        return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"]}
                for r in reconstruction(s, cin) if r["out"] == cin]

    return recognise


for _cls, _variant in (("HiT_SIR", "SIR"), ("HiT_SNG", "SNG"), ("HiT_SRF", "SRF")):
    register_recogniser(_cls, _recognise(_variant))
