"""GRL: image restoration transformer with global, regional and local modelling (Li et al., "Efficient and
Explicit Modelling of Image Hierarchies for Image Restoration", CVPR 2023).

Module names and constructor arguments follow spandrel 0.4.2's ``GRL`` (the authors' "efficient" variant, the one
their released weights use), so checkpoints load with ``strict=True`` and give the same output. A 3x3 stem, a
layer norm, ``len(depths)`` stages of post-normed blocks, a norm, a conv back to the stem's width (plus the stem),
and an SR head (``pixelshuffle``, ``pixelshuffledirect``, ``nearest+conv``) or a restoration head (``""``: a conv,
plus the input when the channels match).

Each block projects its tokens once to q, k, v for two attentions side by side, each on half the channels:
(shifted) square-window attention, and stripe attention through *anchors* (the tokens pooled / projected by
``anchor_window_down_factor``): anchors attend to the stripe's tokens, then the tokens attend to the anchors. Both
are cosine attentions with a learned per-head temperature and a continuous relative-position bias (a small MLP over
log-spaced offsets, ``16 * sigmoid``), through torch's fused attention. Stripes are ``stripe_size`` long, or a
fraction ``1 / stripe_groups`` of the (padded) image side; blocks alternate horizontal / vertical stripes and
shifted / unshifted windows, and shift the stripes in blocks 2 and 3 of every 4 (``stripe_shift``). With
``local_connection`` a conv block with channel attention (HAT's CAB) runs beside the attention.

The reference precomputes bias tables, indices and masks on the host for one size and rebuilds them for any other;
here they are built on the input's device in each forward from its (static) shape, once per forward for all
blocks, so XLA compiles one graph per shape and no buffer is kept (a released checkpoint's stale copies of those
buffers are dropped when loading). Vertical stripes sized by ``stripe_groups`` take their tables from their own
stripe shape; the reference builds them from the horizontal stripe's shape mirrored, which differs only for
non-square inputs (where its forward fails).

Size requirement: none. The input is padded at the bottom / right to ``tile_multiple`` (the least common multiple of
the window, the fixed stripes and ``stripe_groups * anchor_window_down_factor``; the reference takes the largest,
the same wherever it runs) by reflection (edge replication past the side, where the
reference pads zeros), and the output cropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    Mlp,
    NearestUpsample,
    Upsample,
    check_upscale,
    drop_path_rates,
    pad_bottom_right,
    run_checkpointed,
    window_attention,
)
from anysr.archs.hat_arch import CAB
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("", "pixelshuffle", "pixelshuffledirect", "nearest+conv")
ANCHOR_PROJECTIONS = ("avgpool", "maxpool", "conv2d", "separable_conv", "patchmerging")
CONV_TYPES = ("1conv", "3conv", "1conv1x1", "linear")
# Buffers the authors' checkpoints carry (the reference's precomputed tables): not state here, dropped on load.
STALE_BUFFERS = ("table_w", "table_sh", "table_sv", "index_w", "index_sh_a2w", "index_sh_w2a", "index_sv_a2w",
                 "index_sv_w2a", "mask_w", "mask_sh_a2w", "mask_sh_w2a", "mask_sv_a2w", "mask_sv_w2a")
MASK_VALUE = -100.0


# ----------------------------------------------------------------------------- geometry (built on the device)

def stripe_geometry(sizes: Sequence[int | None], groups: Sequence[int | None], shift: bool,
                    resolution: Sequence[int]) -> tuple[list[int], list[int]]:
    """A stripe's (rows, columns) and its shift on a map of ``resolution``: a fixed size (shifted by half), or the
    side divided by the group count (shifted by half a group unless one group)."""
    size, shifts = [], []
    for s, g, d in zip(sizes, groups, resolution, strict=True):
        if g is None:
            size.append(int(s))  # type: ignore[arg-type]
            shifts.append(int(s) // 2 if shift else 0)  # type: ignore[arg-type]
        else:
            size.append(d // g)
            shifts.append(0 if g == 1 else d // (g * 2))
    return size, shifts


def coords_table(window: Sequence[int], down: int, device: torch.device) -> torch.Tensor:
    """(rows, cols, 2) log-spaced relative offsets between a window and its ``down``-times smaller anchor window,
    each axis normalised by its largest positive offset (times 8, then ``sign * log2(1 + |t|) / 3``)."""
    anchor = [w // down for w in window]
    pos = [w1 - 1 - (w1 - w2) // 2 for w1, w2 in zip(window, anchor, strict=True)]
    neg = [-(w2 - 1) - (w1 - w2) // 2 for w1, w2 in zip(window, anchor, strict=True)]
    axes = [torch.arange(n, p + 1, dtype=torch.float32, device=device) / p * 8 for n, p in zip(neg, pos, strict=True)]
    table = torch.stack(torch.meshgrid(axes[0], axes[1], indexing="ij"), dim=-1)
    return torch.sign(table) * torch.log2(table.abs() + 1.0) / 3.0


def coords_index(window: Sequence[int], down: int, window_to_anchor: bool, device: torch.device) -> torch.Tensor:
    """(queries, keys) row of each pair in ``coords_table``'s flattened table: window tokens to anchor tokens, or
    anchors to window tokens; both grids start at (0, 0)."""
    anchor = [w // down for w in window]

    def grid(size: Sequence[int]) -> torch.Tensor:
        r = torch.arange(size[0], device=device)
        c = torch.arange(size[1], device=device)
        return torch.stack(torch.meshgrid(r, c, indexing="ij")).flatten(1)  # (2, n)

    first, second = (grid(window), grid(anchor)) if window_to_anchor else (grid(anchor), grid(window))
    offset = [a - 1 for a in anchor] if window_to_anchor else [w - 1 for w in window]
    diff = first[:, :, None] - second[:, None, :]
    return (diff[0] + offset[0]) * (anchor[1] + window[1] - 1) + diff[1] + offset[1]


def _axis_regions(n: int, window: int, shift: int, device: torch.device) -> torch.Tensor:
    """Region label (0, 1, 2) of each of ``n`` positions after a cyclic shift: the reference's three slices
    ``[:-window]``, ``[-window:-shift]``, ``[-shift:]`` with Python's slice rules (a later slice wins)."""
    idx = torch.arange(n, device=device)
    label = torch.zeros(n, dtype=torch.long, device=device)
    for i, part in enumerate((slice(0, -window), slice(-window, -shift), slice(-shift, None))):
        start, stop, _ = part.indices(n)
        label = torch.where((idx >= start) & (idx < stop), i, label)
    return label


def _window_regions(size: Sequence[int], window: Sequence[int], shift: Sequence[int],
                    device: torch.device) -> torch.Tensor:
    """(windows, tokens) region labels of a ``size`` map cut into ``window`` windows (row-major windows)."""
    label = _axis_regions(size[0], window[0], shift[0], device)[:, None] * 3 + \
        _axis_regions(size[1], window[1], shift[1], device)[None, :]
    h, w = size
    return label.view(h // window[0], window[0], w // window[1], window[1]).permute(0, 2, 1, 3).reshape(
        -1, window[0] * window[1])


def region_mask(size: Sequence[int], window: Sequence[int], shift: Sequence[int], down: int, window_to_anchor: bool,
                device: torch.device) -> torch.Tensor:
    """(windows, queries, keys) additive mask (0 / -100) between a shifted window's tokens and its anchors' (or
    between tokens of one window when ``down`` is 1): pairs from different regions do not attend."""
    tokens = _window_regions(size, window, shift, device)
    anchors = _window_regions([s // down for s in size], [w // down for w in window], [s // down for s in shift],
                              device)
    blocked = tokens[:, :, None] != anchors[:, None, :] if window_to_anchor else \
        anchors[:, :, None] != tokens[:, None, :]
    return torch.zeros(blocked.shape, device=device).masked_fill(blocked, MASK_VALUE)


class Geometry:
    """The tables, indices and masks of one forward (input size), built once and shared by every block."""

    def __init__(self, size: tuple[int, int], window: tuple[int, int], down: int, device: torch.device) -> None:
        self.size, self.window, self.down, self.device = size, window, down, device
        self._cache: dict[Any, Any] = {}

    def _get(self, key: Any, make: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def window_tables(self, shifted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Table, index and (shifted windows only) mask of the square windows."""
        table = self._get("table_w", lambda: coords_table(self.window, 1, self.device))
        index = self._get("index_w", lambda: coords_index(self.window, 1, True, self.device))
        mask = self._get("mask_w", lambda: region_mask(self.size, self.window, [w // 2 for w in self.window], 1,
                                                       True, self.device)) if shifted else None
        return table, index, mask

    def stripe_tables(self, stripe: Sequence[int], shift: Sequence[int], shifted: bool) -> tuple[torch.Tensor, ...]:
        """Table, anchor-to-window / window-to-anchor indices and masks (None unless shifted) of ``stripe``."""
        key, d = tuple(stripe), self.down
        table = self._get(("table", key), lambda: coords_table(stripe, d, self.device))
        a2w = self._get(("a2w", key), lambda: coords_index(stripe, d, False, self.device))
        w2a = self._get(("w2a", key), lambda: coords_index(stripe, d, True, self.device))
        if not shifted:
            return table, a2w, w2a, None, None
        mask_a2w = self._get(("mask_a2w", key), lambda: region_mask(self.size, stripe, shift, d, False, self.device))
        mask_w2a = self._get(("mask_w2a", key), lambda: region_mask(self.size, stripe, shift, d, True, self.device))
        return table, a2w, w2a, mask_a2w, mask_w2a


def _partition(x: torch.Tensor, wh: int, ww: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * windows, wh * ww, c), windows row-major."""
    b, h, w, c = x.shape
    return x.reshape(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, c)


def _merge(windows: torch.Tensor, wh: int, ww: int, h: int, w: int) -> torch.Tensor:
    """Inverse of ``_partition``: (b * windows, wh * ww, c) -> (b, h, w, c)."""
    c = windows.shape[-1]
    x = windows.reshape(-1, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


# ----------------------------------------------------------------------------- attention

class CPB_MLP(nn.Sequential):  # noqa: N801 - the original's module name
    """Continuous position bias: Linear(2, 512), ReLU, Linear(512, heads) without bias."""

    def __init__(self, in_channels: int, out_channels: int, channels: int = 512) -> None:
        super().__init__(nn.Linear(in_channels, channels), nn.ReLU(inplace=True),
                         nn.Linear(channels, out_channels, bias=False))


class AffineTransform(nn.Module):
    """Per-head temperature (``logit_scale``, clamped at log 100) and relative-position bias of a cosine attention."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(num_heads, 1, 1)))
        self.cpb_mlp = CPB_MLP(2, num_heads)

    def temperature(self) -> torch.Tensor:
        """(heads, 1, 1) factor of the cosine similarities."""
        return self.logit_scale.clamp(max=math.log(100.0)).exp()

    def bias(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(heads, queries, keys): ``16 * sigmoid`` of the MLP's value at each pair's offset."""
        values = self.cpb_mlp(table.to(self.logit_scale.dtype)).reshape(-1, self.logit_scale.shape[0])
        n1, n2 = index.shape
        return 16 * torch.sigmoid(values.index_select(0, index.reshape(-1)).reshape(n1, n2, -1).permute(2, 0, 1))


def cosine_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, transform: AffineTransform,
                     table: torch.Tensor, index: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
                     euclidean: bool) -> torch.Tensor:
    """``softmax(t * cos(q, k) + bias [+ mask]) v`` over (windows * b, heads, n, d) tensors, fused; with
    ``euclidean`` the similarity is the distance ``|q - k|`` instead (the authors' ablation; not fused)."""
    bias = transform.bias(table, index)
    if euclidean:
        scores = (q.unsqueeze(-2) - k.unsqueeze(-3)).norm(dim=-1) * transform.temperature() + bias
        if mask is not None:
            nw = mask.shape[0]
            scores = (scores.reshape(-1, nw, *scores.shape[1:]) + mask.unsqueeze(1)).reshape(scores.shape)
        attn = F.dropout(scores.softmax(dim=-1), dropout_p)
        return attn @ v
    q = F.normalize(q, dim=-1) * transform.temperature().to(q.dtype)
    return window_attention(q, F.normalize(k, dim=-1), v, bias, mask, scale=1.0, dropout_p=dropout_p)


class WindowAttention(nn.Module):
    """Cosine attention inside (shifted) square windows; takes (b, h, w, 3c) q/k/v, returns (b, h, w, c)."""

    def __init__(self, window_size: tuple[int, int], num_heads: int, window_shift: bool, attn_drop: float,
                 euclidean_dist: bool) -> None:
        super().__init__()
        self.window_size, self.num_heads = window_size, num_heads
        self.shift_size = window_size[0] // 2 if window_shift else 0
        self.attn_drop, self.euclidean_dist = attn_drop, euclidean_dist
        self.attn_transform = AffineTransform(num_heads)

    def forward(self, qkv: torch.Tensor, geo: Geometry) -> torch.Tensor:
        b, h, w, c3 = qkv.shape
        (wh, ww), s, nh = self.window_size, self.shift_size, self.num_heads
        if s:
            qkv = torch.roll(qkv, shifts=(-s, -s), dims=(1, 2))
        q, k, v = _partition(qkv, wh, ww).reshape(-1, wh * ww, 3, nh, c3 // (3 * nh)).permute(2, 0, 3, 1, 4).unbind(0)
        table, index, mask = geo.window_tables(bool(s))
        out = cosine_attention(q, k, v, self.attn_transform, table, index, mask,
                               self.attn_drop if self.training else 0.0, self.euclidean_dist)
        out = _merge(out.transpose(1, 2).reshape(-1, wh * ww, c3 // 3), wh, ww, h, w)
        return torch.roll(out, shifts=(s, s), dims=(1, 2)) if s else out


class AnchorStripeAttention(nn.Module):
    """Stripe attention through anchors: the stripe's anchors attend to its tokens, then the tokens attend to the
    anchors' results. Takes (b, h, w, 3c) q/k/v and (b, h/df, w/df, c) anchors, returns (b, h, w, c)."""

    def __init__(self, stripe_size: list[int | None], stripe_groups: list[int | None], stripe_shift: bool,
                 num_heads: int, attn_drop: float, anchor_window_down_factor: int, euclidean_dist: bool) -> None:
        super().__init__()
        self.stripe_size, self.stripe_groups, self.stripe_shift = stripe_size, stripe_groups, stripe_shift
        self.num_heads, self.anchor_window_down_factor = num_heads, anchor_window_down_factor
        self.attn_drop, self.euclidean_dist = attn_drop, euclidean_dist
        self.attn_transform1 = AffineTransform(num_heads)
        self.attn_transform2 = AffineTransform(num_heads)

    def forward(self, qkv: torch.Tensor, anchor: torch.Tensor, geo: Geometry) -> torch.Tensor:
        b, h, w, c3 = qkv.shape
        c, nh, df = c3 // 3, self.num_heads, self.anchor_window_down_factor
        (sh, sw), shift = stripe_geometry(self.stripe_size, self.stripe_groups, self.stripe_shift, (h, w))
        ash, asw = sh // df, sw // df
        if self.stripe_shift:
            qkv = torch.roll(qkv, shifts=(-shift[0], -shift[1]), dims=(1, 2))
            anchor = torch.roll(anchor, shifts=(-(shift[0] // df), -(shift[1] // df)), dims=(1, 2))
        q, k, v = _partition(qkv, sh, sw).reshape(-1, sh * sw, 3, nh, c // nh).permute(2, 0, 3, 1, 4).unbind(0)
        anchors = _partition(anchor, ash, asw).reshape(-1, ash * asw, nh, c // nh).transpose(1, 2)
        table, a2w, w2a, mask_a2w, mask_w2a = geo.stripe_tables((sh, sw), shift, self.stripe_shift)
        p = self.attn_drop if self.training else 0.0
        out = cosine_attention(anchors, k, v, self.attn_transform1, table, a2w, mask_a2w, p, self.euclidean_dist)
        out = cosine_attention(q, anchors, out, self.attn_transform2, table, w2a, mask_w2a, p, self.euclidean_dist)
        out = _merge(out.transpose(1, 2).reshape(-1, sh * sw, c), sh, sw, h, w)
        return torch.roll(out, shifts=(shift[0], shift[1]), dims=(1, 2)) if self.stripe_shift else out


class SeparableConv(nn.Sequential):
    """Depth-wise ``kernel_size`` conv (stride ``stride``) then a point-wise conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, bias: bool) -> None:
        super().__init__(nn.Conv2d(in_channels, in_channels, kernel_size, stride, kernel_size // 2, groups=in_channels,
                                   bias=bias),
                         nn.Conv2d(in_channels, out_channels, 1, 1, 0, bias=bias))


class QKVProjection(nn.Module):
    """Tokens to q, k, v of both attentions: a linear layer or a separable conv; (b, h, w, c) -> (b, h, w, 3c)."""

    def __init__(self, dim: int, qkv_bias: bool, proj_type: str) -> None:
        super().__init__()
        self.conv = proj_type == "separable_conv"
        self.body = SeparableConv(dim, dim * 3, 3, 1, qkv_bias) if self.conv else nn.Linear(dim, dim * 3, qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv:
            return self.body(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.body(x)


class PatchMerging(nn.Module):
    """Each 2x2 patch's four tokens side by side, then a bias-free linear layer; (b, h, w, c) -> (b, h/2, w/2, o)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.reduction = nn.Linear(4 * in_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        # the reference's order: (row 0, col 0), (row 1, col 0), (row 0, col 1), (row 1, col 1)
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h // 2, w // 2, 4 * c)
        return self.reduction(x)


class AnchorLinear(nn.Module):
    """Average / max pooling by ``down_factor`` then a linear layer; (b, h, w, c) -> (b, h/df, w/df, o)."""

    def __init__(self, in_channels: int, out_channels: int, down_factor: int, pooling_mode: str) -> None:
        super().__init__()
        self.down_factor, self.max = down_factor, pooling_mode == "maxpool"
        self.reduction = nn.Linear(in_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        d = self.down_factor
        blocks = x.reshape(b, h // d, d, w // d, d, c)
        pooled = blocks.amax(dim=(2, 4)) if self.max else blocks.mean(dim=(2, 4))
        return self.reduction(pooled)


class AnchorProjection(nn.Module):
    """The anchors: the tokens reduced by ``anchor_window_down_factor`` to half the channels, in one step or in
    x2 steps; (b, h, w, c) -> (b, h/df, w/df, c/2)."""

    def __init__(self, dim: int, proj_type: str, one_stage: bool, down: int) -> None:
        super().__init__()
        self.proj_type = proj_type
        self.body = nn.ModuleList()
        if one_stage:
            if proj_type == "patchmerging":
                self.body.append(PatchMerging(dim, dim // 2))
            elif proj_type == "conv2d":
                self.body.append(nn.Conv2d(dim, dim // 2, down + 1, down, (down + 1) // 2))
            elif proj_type == "separable_conv":
                self.body.append(SeparableConv(dim, dim // 2, down + 1, down, True))
            else:
                self.body.append(AnchorLinear(dim, dim // 2, down, proj_type))
        else:
            for i in range(int(math.log2(down))):
                cin = dim if i == 0 else dim // 2
                if proj_type == "patchmerging":
                    self.body.append(PatchMerging(cin, dim // 2))
                elif proj_type == "conv2d":
                    self.body.append(nn.Conv2d(cin, dim // 2, 3, 2, 1))
                else:
                    self.body.append(SeparableConv(cin, dim // 2, 3, 2, True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "conv" in self.proj_type:
            x = x.permute(0, 3, 1, 2)
            for m in self.body:
                x = m(x)
            return x.permute(0, 2, 3, 1)
        for m in self.body:
            x = m(x)
        return x


class MixedAttention(nn.Module):
    """One q/k/v projection, window attention on the first half of the channels and anchored stripe attention on
    the second, concatenated and projected."""

    def __init__(self, dim: int, num_heads_w: int, num_heads_s: int, window_size: tuple[int, int],
                 window_shift: bool, stripe_size: list[int | None], stripe_groups: list[int | None],
                 stripe_shift: bool, qkv_bias: bool, qkv_proj_type: str, anchor_proj_type: str,
                 anchor_one_stage: bool, anchor_window_down_factor: int, attn_drop: float, proj_drop: float,
                 euclidean_dist: bool) -> None:
        super().__init__()
        self.qkv = QKVProjection(dim, qkv_bias, qkv_proj_type)
        self.anchor = AnchorProjection(dim, anchor_proj_type, anchor_one_stage, anchor_window_down_factor)
        self.window_attn = WindowAttention(window_size, num_heads_w, window_shift, attn_drop, euclidean_dist)
        self.stripe_attn = AnchorStripeAttention(stripe_size, stripe_groups, stripe_shift, num_heads_s, attn_drop,
                                                 anchor_window_down_factor, euclidean_dist)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, geo: Geometry) -> torch.Tensor:
        c = x.shape[-1]
        qkv_window, qkv_stripe = torch.split(self.qkv(x), c * 3 // 2, dim=-1)
        out = torch.cat([self.window_attn(qkv_window, geo), self.stripe_attn(qkv_stripe, self.anchor(x), geo)], -1)
        return self.proj_drop(self.proj(out))


class EfficientMixAttnTransformerBlock(nn.Module):
    """``x + norm1(attn(x)) [+ CAB(x)]``, then ``x + norm2(mlp(x))`` (post-norm, residuals scaled by
    ``res_scale``); on (b, h, w, c) tokens. Odd blocks use vertical stripes (the stripe size reversed)."""

    def __init__(self, dim: int, num_heads_w: int, num_heads_s: int, window_size: tuple[int, int],
                 window_shift: bool, stripe_size: list[int | None], stripe_groups: list[int | None],
                 stripe_shift: bool, stripe_type: str, mlp_ratio: float, qkv_bias: bool, qkv_proj_type: str,
                 anchor_proj_type: str, anchor_one_stage: bool, anchor_window_down_factor: int, drop: float,
                 attn_drop: float, drop_path: float, res_scale: float, local_connection: bool,
                 euclidean_dist: bool) -> None:
        super().__init__()
        if stripe_type == "W":
            stripe_size, stripe_groups = stripe_size[::-1], stripe_groups[::-1]
        self.res_scale = res_scale
        self.attn = MixedAttention(dim, num_heads_w, num_heads_s, window_size, window_shift, stripe_size,
                                   stripe_groups, stripe_shift, qkv_bias, qkv_proj_type, anchor_proj_type,
                                   anchor_one_stage, anchor_window_down_factor, attn_drop, drop, euclidean_dist)
        self.norm1 = nn.LayerNorm(dim)
        self.local = local_connection
        if local_connection:
            self.conv = CAB(dim, 4, 18)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, geo: Geometry) -> torch.Tensor:
        y = x + self.res_scale * self.drop_path(self.norm1(self.attn(x, geo)))
        if self.local:
            y = y + self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return y + self.res_scale * self.drop_path(self.norm2(self.mlp(y)))


class LinearConv(nn.Linear):
    """A linear layer over the channels of a (b, c, h, w) map (``conv_type: linear``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def last_conv(conv_type: str, dim: int) -> nn.Module:
    """The conv closing a stage and the body."""
    if conv_type == "1conv":
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if conv_type == "3conv":
        return nn.Sequential(nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                             nn.Conv2d(dim // 4, dim // 4, 1, 1, 0), nn.LeakyReLU(0.2, inplace=True),
                             nn.Conv2d(dim // 4, dim, 3, 1, 1))
    if conv_type == "1conv1x1":
        return nn.Conv2d(dim, dim, 1, 1, 0)
    return LinearConv(dim, dim)


class TransformerStage(nn.Module):
    """Blocks (alternating shifted windows, horizontal / vertical stripes) then ``conv``, plus the input."""

    def __init__(self, dim: int, depth: int, num_heads_window: int, num_heads_stripe: int,
                 window_size: tuple[int, int], stripe_size: list[int | None], stripe_groups: list[int | None],
                 stripe_shift: bool, drop_path: Sequence[float], conv_type: str, init_method: str,
                 checkpointing: bool, **block: Any) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.blocks = nn.ModuleList([EfficientMixAttnTransformerBlock(
            dim, num_heads_window, num_heads_stripe, window_size, i % 2 == 0, stripe_size, stripe_groups,
            i % 4 in (2, 3) if stripe_shift else False, "H" if i % 2 == 0 else "W", drop_path=drop_path[i],
            res_scale=0.1 if init_method == "r" else 1.0, **block) for i in range(depth)])
        self.conv = last_conv(conv_type, dim)

    def forward(self, x: torch.Tensor, geo: Geometry) -> torch.Tensor:
        res = x
        for blk in self.blocks:
            res = run_checkpointed(blk, res, geo, enabled=self.checkpointing and self.training)
        return self.conv(res.permute(0, 3, 1, 2)).permute(0, 2, 3, 1) + x


class _PixelShuffleHead(nn.Module):
    """The reference's ``upsample`` module: its layers under ``up``."""

    def __init__(self, layers: nn.Sequential) -> None:
        super().__init__()
        self.up = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.zeros_(m.bias)
        nn.init.ones_(m.weight)


@torch.no_grad()
def _init_stage(stage: TransformerStage, init_method: str) -> None:
    """The authors' large-model initialisations: ``l`` zeroes the post-norms, ``w`` scales linear and conv weights
    by 0.1, ``t<digits>`` re-draws linear weights (std from the digits) and scales conv weights by 0.1 (the
    position-bias MLPs are left alone)."""
    for name, m in stage.named_modules():
        if init_method == "l" and isinstance(m, nn.LayerNorm):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)
        elif init_method == "w" and isinstance(m, (nn.Linear, nn.Conv2d)) and "cpb_mlp" not in name:
            m.weight.mul_(0.1)
        elif "t" in init_method:
            std = 0.1 ** (len(init_method) - 1) * int(init_method[-1])
            if isinstance(m, nn.Linear) and "cpb_mlp" not in name:
                nn.init.trunc_normal_(m.weight, std=std)
            elif isinstance(m, nn.Conv2d):
                m.weight.mul_(0.1)


def _drop_stale_buffers(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """The authors' checkpoints carry the reference's precomputed tables / masks: not state here."""
    for name in STALE_BUFFERS:
        state_dict.pop(prefix + name, None)


def _check_args(depths: Sequence[int], num_heads_window: Sequence[int], num_heads_stripe: Sequence[int],
                embed_dim: int, window_size: int, stripe_size: Sequence[int | None],
                stripe_groups: Sequence[int | None], upscale: int, upsampler: str, qkv_proj_type: str,
                anchor_proj_type: str, anchor_one_stage: bool, down: int, conv_type: str, init_method: str,
                local_connection: bool) -> None:
    if not depths or len(num_heads_window) != len(depths) or len(num_heads_stripe) != len(depths):
        raise ArchArgumentError("depths", f"GRL needs one num_heads_window and num_heads_stripe per stage: depths "
                                f"{list(depths)}, num_heads_window {list(num_heads_window)}, num_heads_stripe "
                                f"{list(num_heads_stripe)}")
    for arg, heads in (("num_heads_window", num_heads_window), ("num_heads_stripe", num_heads_stripe)):
        if any(h < 1 or (embed_dim // 2) % h for h in heads):
            raise ArchArgumentError(arg, f"GRL needs embed_dim / 2 ({embed_dim // 2}) to be a multiple of each "
                                    f"of {arg} {list(heads)}")
    if embed_dim % 2 or embed_dim < 2:
        raise ArchArgumentError("embed_dim", f"GRL needs an even embed_dim, not {embed_dim}")
    if local_connection and embed_dim < 18:
        raise ArchArgumentError("embed_dim", f"GRL's local_connection needs embed_dim >= 18 (its channel "
                                f"attention divides by 18), not {embed_dim}")
    if len(stripe_size) != 2 or len(stripe_groups) != 2 or any(
            s is None and g is None for s, g in zip(stripe_size, stripe_groups, strict=True)):
        raise ArchArgumentError("stripe_size", f"GRL needs two stripe sizes and two stripe groups, one of each "
                                f"pair set: stripe_size {list(stripe_size)}, stripe_groups {list(stripe_groups)}")
    if down < 1 or down & (down - 1):
        raise ArchArgumentError("anchor_window_down_factor", f"GRL needs a power-of-two anchor_window_down_factor, "
                                f"not {down}")
    if window_size < 2 or window_size % 2:
        raise ArchArgumentError("window_size", f"GRL needs an even window_size >= 2, not {window_size}")
    if any(s is not None and (s < down or s % down) for s in stripe_size):
        raise ArchArgumentError("stripe_size", f"GRL needs each stripe_size {list(stripe_size)} to be a multiple "
                                f"of anchor_window_down_factor ({down})")
    if upsampler not in UPSAMPLERS:
        raise ArchArgumentError("upsampler", f"GRL has no upsampler {upsampler!r}; choose one of "
                                f"{', '.join(repr(u) for u in UPSAMPLERS)}")
    if upsampler == "nearest+conv" and upscale != 4:
        raise ArchArgumentError("upscale", f"GRL's 'nearest+conv' upsampler is x4 only, not x{upscale}")
    if upsampler in ("pixelshuffle", "pixelshuffledirect"):
        check_upscale(upscale)
    if upsampler == "" and upscale != 1:
        raise ArchArgumentError("upsampler", f"GRL without an upsampler is x1; for x{upscale} set upsampler to "
                                "'pixelshuffle', 'pixelshuffledirect' or 'nearest+conv'")
    if qkv_proj_type not in ("linear", "separable_conv"):
        raise ArchArgumentError("qkv_proj_type", f"GRL's qkv_proj_type is 'linear' or 'separable_conv', not "
                                f"{qkv_proj_type!r}")
    if anchor_proj_type not in ANCHOR_PROJECTIONS or (not anchor_one_stage and "pool" in anchor_proj_type):
        raise ArchArgumentError("anchor_proj_type", f"GRL's anchor_proj_type is one of "
                                f"{', '.join(ANCHOR_PROJECTIONS)} (pooling only with anchor_one_stage), not "
                                f"{anchor_proj_type!r}")
    if anchor_one_stage and anchor_proj_type == "patchmerging" and down != 2:
        raise ArchArgumentError("anchor_window_down_factor", "GRL's one-stage 'patchmerging' anchors halve the "
                                f"size: anchor_window_down_factor must be 2, not {down}")
    if anchor_one_stage and anchor_proj_type == "conv2d" and down == 1:
        raise ArchArgumentError("anchor_window_down_factor", "GRL's 'conv2d' anchors need "
                                "anchor_window_down_factor >= 2")
    if conv_type not in CONV_TYPES:
        raise ArchArgumentError("conv_type", f"GRL's conv_type is one of {', '.join(CONV_TYPES)}, not {conv_type!r}")
    if init_method not in ("n", "l", "w", "r") and not (
            init_method.startswith("t") and len(init_method) > 1 and init_method[-1].isdigit()):
        raise ArchArgumentError("init_method", f"GRL's init_method is 'n', 'l', 'w', 'r' or 't<digits>', not "
                                f"{init_method!r}")


@ARCH_REGISTRY.register()
class GRL(nn.Module):
    """GRL (see the module docstring). ``img_size``, ``out_proj_type`` and the ``pretrained_*`` sizes are accepted
    for the original signature and change nothing (as in the reference); ``fairscale_checkpoint`` turns on
    activation checkpointing per block (torch's own)."""

    dropped_buffers = STALE_BUFFERS  # the reference's precomputed tables: built in each forward here

    def __init__(self, *, img_size: int | Sequence[int] = 64, in_channels: int = 3, out_channels: int = 3,
                 embed_dim: int = 96, upscale: int = 1, img_range: float = 1.0, upsampler: str = "",
                 depths: Sequence[int] = (6, 6, 6, 6, 6, 6), num_heads_window: Sequence[int] = (3, 3, 3, 3, 3, 3),
                 num_heads_stripe: Sequence[int] = (3, 3, 3, 3, 3, 3), window_size: int = 8,
                 stripe_size: Sequence[int | None] = (8, 8), stripe_groups: Sequence[int | None] = (None, None),
                 stripe_shift: bool = False, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qkv_proj_type: str = "linear", anchor_proj_type: str = "avgpool", anchor_one_stage: bool = True,
                 anchor_window_down_factor: int = 1, out_proj_type: str = "linear", local_connection: bool = False,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 pretrained_window_size: Sequence[int] = (0, 0), pretrained_stripe_size: Sequence[int] = (0, 0),
                 conv_type: str = "1conv", init_method: str = "n", fairscale_checkpoint: bool = False,
                 offload_to_cpu: bool = False, euclidean_dist: bool = False) -> None:
        super().__init__()
        del img_size, pretrained_window_size, pretrained_stripe_size  # no precomputed buffers (module docstring)
        if out_proj_type not in ("linear", "conv2d"):
            raise ArchArgumentError("out_proj_type", f"GRL's out_proj_type is 'linear' or 'conv2d', not "
                                    f"{out_proj_type!r}")
        if offload_to_cpu:
            raise ArchArgumentError("offload_to_cpu", "GRL in anysr does not offload activations to the CPU; "
                                    "remove offload_to_cpu (fairscale_checkpoint alone recomputes them)")
        stripe_size, stripe_groups = list(stripe_size), list(stripe_groups)
        _check_args(depths, num_heads_window, num_heads_stripe, embed_dim, window_size, stripe_size, stripe_groups,
                    upscale, upsampler, qkv_proj_type, anchor_proj_type, anchor_one_stage, anchor_window_down_factor,
                    conv_type, init_method, local_connection)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_in_ch = in_channels
        self.upscale, self.upsampler, self.img_range = upscale, upsampler, img_range
        self.window_size = (window_size, window_size)
        self.anchor_window_down_factor = anchor_window_down_factor
        mean = (0.4488, 0.4371, 0.4040) if in_channels == 3 else (0.0,)
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        # the reference pads to the largest of these; their least common multiple is the same wherever it runs
        self.pad_size = math.lcm(window_size, *[s for s in stripe_size if s is not None],
                                 *[g * anchor_window_down_factor for g in stripe_groups if g is not None])
        self.tile_multiple = self.pad_size

        self.conv_first = nn.Conv2d(in_channels, embed_dim, 3, 1, 1)
        self.norm_start = nn.LayerNorm(embed_dim)
        self.pos_drop = nn.Dropout(drop_rate)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        block = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qkv_proj_type=qkv_proj_type,
                     anchor_proj_type=anchor_proj_type, anchor_one_stage=anchor_one_stage,
                     anchor_window_down_factor=anchor_window_down_factor, drop=drop_rate, attn_drop=attn_drop_rate,
                     local_connection=local_connection, euclidean_dist=euclidean_dist)
        self.layers = nn.ModuleList([
            TransformerStage(embed_dim, d, num_heads_window[i], num_heads_stripe[i], self.window_size, stripe_size,
                             stripe_groups, stripe_shift, rates[sum(depths[:i]):sum(depths[:i + 1])], conv_type,
                             init_method, fairscale_checkpoint, **block)
            for i, d in enumerate(depths)])
        self.norm_end = nn.LayerNorm(embed_dim)
        self.conv_after_body = last_conv(conv_type, embed_dim)

        feats = 64
        if upsampler == "pixelshuffle":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, feats, 3, 1, 1), nn.LeakyReLU(inplace=True))
            self.upsample = _PixelShuffleHead(Upsample(upscale, feats))
            self.conv_last = nn.Conv2d(feats, out_channels, 3, 1, 1)
        elif upsampler == "pixelshuffledirect":
            self.upsample = _PixelShuffleHead(nn.Sequential(nn.Conv2d(embed_dim, upscale**2 * out_channels, 3, 1, 1),
                                                            nn.PixelShuffle(upscale)))
        elif upsampler == "nearest+conv":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, feats, 3, 1, 1), nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(feats, feats, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(feats, feats, 3, 1, 1)
            self.conv_hr = nn.Conv2d(feats, feats, 3, 1, 1)
            self.conv_last = nn.Conv2d(feats, out_channels, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(0.2, inplace=True)
            self.nearest = NearestUpsample(2)
        else:
            self.conv_last = nn.Conv2d(embed_dim, out_channels, 3, 1, 1)

        self.apply(_init_weights)
        if init_method in ("l", "w") or "t" in init_method:
            for layer in self.layers:
                _init_stage(layer, init_method)
        self.register_load_state_dict_pre_hook(_drop_stale_buffers)

    def no_weight_decay_keywords(self) -> set[str]:
        """Names kept out of weight decay (the reference's list)."""
        return {"relative_position_bias_table"}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The body on a padded (b, c, h, w) map."""
        size = (x.shape[2], x.shape[3])
        geo = Geometry(size, self.window_size, self.anchor_window_down_factor, x.device)
        t = self.pos_drop(self.norm_start(x.permute(0, 2, 3, 1)))
        for layer in self.layers:
            t = layer(t, geo)
        return self.norm_end(t).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_bottom_right(x, (-h) % self.pad_size, (-w) % self.pad_size)
        mean = self.mean.to(x.dtype)
        x = (x - mean) * self.img_range
        if self.upsampler == "":
            first = self.conv_first(x)
            res = self.conv_after_body(self.forward_features(first)) + first
            x = x + self.conv_last(res) if self.in_channels == self.out_channels else self.conv_last(res)
        else:
            x = self.conv_first(x)
            x = self.conv_after_body(self.forward_features(x)) + x
            if self.upsampler == "pixelshuffle":
                x = self.conv_last(self.upsample(self.conv_before_upsample(x)))
            elif self.upsampler == "pixelshuffledirect":
                x = self.upsample(x)
            else:
                x = self.conv_before_upsample(x)
                x = self.lrelu(self.conv_up1(self.nearest(x)))
                x = self.lrelu(self.conv_up2(self.nearest(x)))
                x = self.conv_last(self.lrelu(self.conv_hr(x)))
        x = x / self.img_range + mean
        return x[:, :, : h * self.upscale, : w * self.upscale]



# traiNNer-redux's variants (its builders call spandrel's GRL with these arguments; x4 by default).
_TRAINNER_COMMON = {"upsampler": "pixelshuffle", "window_size": 8, "stripe_size": [8, None],
                    "stripe_groups": [None, 4], "stripe_shift": True, "mlp_ratio": 2.0,
                    "anchor_window_down_factor": 4, "upscale": 4}
register_presets("GRL", scale_arg="upscale", presets={
    "grl_b": {**_TRAINNER_COMMON, "embed_dim": 180, "depths": [4, 4, 8, 8, 8, 4, 4],
              "num_heads_window": [3] * 7, "num_heads_stripe": [3] * 7, "local_connection": True},
    "grl_s": {**_TRAINNER_COMMON, "embed_dim": 128, "depths": [4, 4, 4, 4], "num_heads_window": [2] * 4,
              "num_heads_stripe": [2] * 4},
    "grl_t": {**_TRAINNER_COMMON, "embed_dim": 64, "upsampler": "pixelshuffledirect", "depths": [4, 4, 4, 4],
              "num_heads_window": [2] * 4, "num_heads_stripe": [2] * 4},
})


def _recognise(s: StateShapes) -> list[dict[str, Any]]:
    """GRL from its tensors: widths, depths and heads per stage, the head, the q/k/v and anchor projections, the
    stage conv, ``local_connection`` and ``mlp_ratio``. Windows and stripes leave no tensor but the authors'
    precomputed tables (when the file carries them: ``_geometry_from_tables``); without them they are read as
    spandrel reads them (``_published_geometry``). Pooled and patch-merged one-stage anchors do not show their down
    factor (4, as the published models, then 2)."""
    s.shape("layers.0.blocks.0.attn.window_attn.attn_transform.logit_scale")
    in_ch, dim = s.dim("conv_first.weight", 1), s.dim("conv_first.weight", 0)
    prefix = "layers.0.blocks.0.attn."
    stages = s.indices("layers.")
    args: dict[str, Any] = {
        "in_channels": in_ch, "embed_dim": dim,
        "depths": [s.count(f"layers.{i}.blocks.") for i in stages],
        "num_heads_window": [s.dim(f"layers.{i}.blocks.0.attn.window_attn.attn_transform.logit_scale", 0)
                             for i in stages],
        "num_heads_stripe": [s.dim(f"layers.{i}.blocks.0.attn.stripe_attn.attn_transform1.logit_scale", 0)
                             for i in stages],
        "mlp_ratio": s.dim("layers.0.blocks.0.mlp.fc1.weight", 0) / dim,
        "local_connection": "layers.0.blocks.0.conv.cab.0.weight" in s,
    }
    if prefix + "qkv.body.weight" in s:
        args.update(qkv_proj_type="linear", qkv_bias=prefix + "qkv.body.bias" in s)
    else:
        args.update(qkv_proj_type="separable_conv", qkv_bias=prefix + "qkv.body.0.bias" in s)
    if "conv_after_body.weight" not in s:
        args["conv_type"] = "3conv"
    elif len(s.shape("conv_after_body.weight")) == 2:
        args["conv_type"] = "linear"
    else:
        args["conv_type"] = "1conv1x1" if s.dim("conv_after_body.weight", 2) == 1 else "1conv"
    heads: list[dict[str, Any]] = []
    if "upsample.up.0.weight" in s and "conv_before_upsample.0.weight" in s:
        convs = s.indices("upsample.up.")
        scale = 3 if s.dim("upsample.up.0.weight", 0) == 9 * 64 else 2 ** len(convs)
        heads.append({"upsampler": "pixelshuffle", "upscale": scale, "out_channels": s.dim("conv_last.weight", 0)})
    elif "upsample.up.0.weight" in s:
        heads += [{"upsampler": "pixelshuffledirect", "upscale": scale, "out_channels": out}
                  for out, scale in shuffle_splits(s.dim("upsample.up.0.weight", 0), (in_ch, 3, 1))]
    elif "conv_up1.weight" in s:
        heads.append({"upsampler": "nearest+conv", "upscale": 4, "out_channels": s.dim("conv_last.weight", 0)})
    else:
        heads.append({"upsampler": "", "upscale": 1, "out_channels": s.dim("conv_last.weight", 0)})
    anchor = prefix + "anchor.body."
    stages_a = s.count(anchor)
    if stages_a > 1 or (stages_a == 1 and anchor + "1.reduction.weight" in s):
        kind = "patchmerging" if anchor + "0.reduction.weight" in s else \
            "conv2d" if anchor + "0.weight" in s else "separable_conv"
        anchors = [{"anchor_proj_type": kind, "anchor_one_stage": False, "anchor_window_down_factor": 2**stages_a}]
    elif anchor + "0.reduction.bias" in s:
        anchors = [{"anchor_proj_type": "avgpool", "anchor_window_down_factor": d} for d in (4, 2, 1)]
    elif anchor + "0.reduction.weight" in s:
        anchors = [{"anchor_proj_type": "patchmerging", "anchor_window_down_factor": 2}]
    elif anchor + "0.weight" in s:
        anchors = [{"anchor_proj_type": "conv2d", "anchor_window_down_factor": s.dim(anchor + "0.weight", 2) - 1}]
    else:
        anchors = [{"anchor_proj_type": "separable_conv",
                    "anchor_window_down_factor": s.dim(anchor + "0.0.weight", 2) - 1}]
    tables = _geometry_from_tables(s)
    if tables is not None:  # the file says its down factor: try it first
        anchors.sort(key=lambda a: a["anchor_window_down_factor"] != tables["anchor_window_down_factor"])
    proposals = []
    for head in heads:
        for a in anchors:
            geometry = {**_published_geometry(head["upsampler"], a["anchor_window_down_factor"]),
                        **({k: v for k, v in tables.items() if k != "anchor_window_down_factor"} if tables else {})}
            proposals.append({**args, **head, **a, **geometry, "stripe_shift": True})
    return proposals


def _published_geometry(upsampler: str, down: int) -> dict[str, Any]:
    """Window and stripe sizes of the published models by task, as spandrel reads them from a file without tables:
    restoration (x1) 8 / [8, 8], blind SR (nearest+conv) 16 / [32, 64], SR 32 / [64, 64] (a stripe at least the
    anchors' down factor)."""
    if upsampler == "nearest+conv":
        return {"window_size": 16, "stripe_size": [32, 64]}
    if upsampler:
        return {"window_size": 32, "stripe_size": [64, 64]}
    stripe = 8 if 8 % down == 0 else down
    return {"window_size": 8, "stripe_size": [stripe, stripe]}


def _geometry_from_tables(s: StateShapes) -> dict[str, Any] | None:
    """Window, stripe and anchor down factor from the authors' precomputed tables, None when the file has none:
    ``table_w`` is (1, 2w - 1, 2w - 1, 2), ``index_sh_a2w`` pairs a stripe's tokens with its down**2 times fewer
    anchors, ``table_sh`` is (1, s + s / down - 1, ...) per stripe side."""
    if not all(k in s for k in ("table_w", "table_sh", "index_sh_a2w")):
        return None
    window = (s.dim("table_w", 1) + 1) // 2
    pairs = s.shape("index_sh_a2w")
    down = math.isqrt(max(pairs) // max(min(pairs), 1))
    if down < 1 or down * down * min(pairs) != max(pairs):
        return None
    stripe = [round((s.dim("table_sh", i) + 1) / (1 + 1 / down)) for i in (1, 2)]
    return {"window_size": window, "stripe_size": stripe, "anchor_window_down_factor": down}


register_recogniser("GRL", _recognise)
