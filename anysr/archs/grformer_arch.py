"""GRFormer: grouped residual self-attention transformer for lightweight super-resolution (Tang et al., ACM MM
2024), as neosr trains it (``grformer``, presets ``grformer_medium`` / ``grformer_large``).

SwinIR's layout (shallow conv, residual groups of window-attention blocks closed by a conv, a long skip) with
GRSA blocks: the channels split in two halves, each with its own residual linear q / k / v (``x + q1(x)``) and
output projection; cosine attention with a learned, clamped per-head temperature; an exponential-space relative
position bias from a small MLP over log-spaced offsets (``16 * sigmoid``); post-norm residuals; an MLP with a
depth-wise conv branch. Rectangular windows (8 x 32 by default) alternate their orientation every two blocks;
every second block is shifted. The reconstruction is one conv and a pixel shuffle. Constructor arguments,
module names and buffers follow neosr's code, so its weights load with ``strict=True`` and give its outputs.

Differences from neosr's code, none of which changes the output of a valid configuration:

* the shifted blocks' masks are computed for the input's size (the stored ``attn_mask`` buffer, the mask at
  ``img_size``, is kept for strict loading; it is the same values there), with tensor ops of static shapes;
* the input is padded (reflect, replicate beyond) to a multiple of both window sides (neosr: of the longer one,
  which it needs to be);
* attention runs in the fused kernel; arguments neosr accepts and never uses (``qkv_bias``, ``qk_scale``,
  ``ape``, ``patch_norm``) are accepted and ignored likewise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    SwinSRBase,
    block_drop_rates,
    check_upscale,
    drop_path_rates,
    relative_position_index,
    to_feature_map,
    to_tokens,
)
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import clean
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

Pair = tuple[int, int]


def _windows(x: torch.Tensor, window: Pair) -> torch.Tensor:
    """(b, h, w, c) -> (b * nw, wh, ww, c) for a rectangular window."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window[0], window[0], w // window[1], window[1], c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window[0], window[1], c)


def _unwindows(x: torch.Tensor, window: Pair, h: int, w: int) -> torch.Tensor:
    """Inverse of ``_windows``: -> (b, h, w, c)."""
    nh, nw = h // window[0], w // window[1]
    x = x.view(-1, nh, nw, window[0], window[1], x.shape[-1])
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, x.shape[-1])


def grformer_mask(h: int, w: int, window: Pair, shift: Pair, device: torch.device | None = None) -> torch.Tensor:
    """(num_windows, n, n) additive mask of neosr's shifted blocks: 0 within a region, -1e9 across. Regions as
    neosr labels them: along each axis ``[0, n - window)``, ``[n - window, n - shift)``, ``[n - shift, n)``, the
    later overwriting the earlier (a shift longer than the window leaves two)."""

    def labels(n: int, win: int, s: int) -> torch.Tensor:
        idx = torch.arange(n, device=device)
        return torch.where(idx >= n - s, 2, torch.where(idx >= n - win, 1, 0))

    label = (labels(h, window[0], shift[0])[:, None] * 3 + labels(w, window[1], shift[1])[None, :])[None, :, :, None]
    flat = _windows(label, window).reshape(-1, window[0] * window[1])
    blocked = flat.unsqueeze(2) != flat.unsqueeze(1)
    zeros = torch.zeros(blocked.shape, device=blocked.device)
    return torch.where(blocked, torch.full_like(zeros, -1e9), zeros)


def log_spaced_offsets(window: Pair) -> torch.Tensor:
    """(1, 2wh-1, 2ww-1, 2): each relative offset scaled to [-3.2, 3.2] and mapped by ``sign * (1 - exp(-|x|))``."""
    wh, ww = window
    grid = torch.stack(torch.meshgrid(torch.arange(1 - wh, wh, dtype=torch.float32),
                                      torch.arange(1 - ww, ww, dtype=torch.float32), indexing="ij"))
    grid = grid.permute(1, 2, 0) / torch.tensor([wh - 1, ww - 1], dtype=torch.float32) * 3.2
    return (torch.sign(grid) * (1 - torch.exp(-grid.abs()))).unsqueeze(0)


@functools.lru_cache(maxsize=32)
def _host_buffers(window: Pair, shift: Pair, img_size: Pair) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A block's constant buffers on the CPU (offsets, index, the mask at ``img_size`` or None), computed once per
    layout: a large preset repeats the same few, and the meta device computes each op slowly."""
    with torch.device("cpu"):
        mask = grformer_mask(*img_size, window, shift) if shift[0] > 0 else None
        return log_spaced_offsets(window), relative_position_index(window), mask


def _here(t: torch.Tensor) -> torch.Tensor:
    """A copy of a cached CPU buffer on the device modules are being built on (the default device)."""
    return t.to(torch.empty(0).device, copy=True)


class dwconv(nn.Module):  # noqa: N801 - neosr's class name
    """Two depth-wise 3x3 convs with a GELU between, on tokens (``depthwise_conv``)."""

    def __init__(self, hidden_features: int) -> None:
        super().__init__()
        self.hidden_features = hidden_features
        self.depthwise_conv = nn.Sequential(
            nn.Conv2d(hidden_features, hidden_features, 3, 1, 1, groups=hidden_features), nn.GELU(),
            nn.Conv2d(hidden_features, hidden_features, 3, 1, 1, groups=hidden_features))

    def forward(self, x: torch.Tensor, x_size: Pair) -> torch.Tensor:
        return to_tokens(self.depthwise_conv(to_feature_map(x, *x_size)))


class FFN(nn.Module):
    """fc1, activation, ``+ dwconv``, fc2."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        self.act = act_layer()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = dwconv(hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, x_size: Pair) -> torch.Tensor:
        x = self.act(self.fc1(x))
        return self.drop(self.fc2(self.drop(x + self.dwconv(x, x_size))))


class GRSA(nn.Module):
    """Grouped residual self-attention in (wh, ww) windows: two channel halves with residual linear q/k/v and
    their own projections, cosine attention, the MLP position bias (buffers ``relative_position_bias_table``:
    the offsets it reads; ``relative_position_index``)."""

    def __init__(self, dim: int, window_size: Pair, num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.qkv_bias = qkv_bias
        self.num_heads = num_heads
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.ESRPB_MLP = nn.Sequential(nn.Linear(2, 128), nn.ReLU(inplace=True),
                                       nn.Linear(128, num_heads, bias=False))
        offsets, index, _ = _host_buffers((window_size[0], window_size[1]), (0, 0), (1, 1))
        self.register_buffer("relative_position_bias_table", _here(offsets))
        self.register_buffer("relative_position_index", _here(index))
        half = dim // 2
        self.q1, self.q2 = nn.Linear(half, half), nn.Linear(half, half)
        self.k1, self.k2 = nn.Linear(half, half), nn.Linear(half, half)
        self.v1, self.v2 = nn.Linear(half, half), nn.Linear(half, half)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj1, self.proj2 = nn.Linear(half, half), nn.Linear(half, half)
        self.proj_drop = nn.Dropout(proj_drop)

    def _heads(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        b_, n, _ = a.shape
        return torch.cat([a, b], dim=-1).view(b_, n, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (windows * b, n, c); mask: (windows, n, n) or None."""
        b_, n, c = x.shape
        x1, x2 = x[..., : c // 2], x[..., c // 2:]
        q = self._heads(x1 + self.q1(x1), x2 + self.q2(x2))
        k = self._heads(x1 + self.k1(x1), x2 + self.k2(x2))
        v = self._heads(x1 + self.v1(x1), x2 + self.v2(x2))
        temperature = torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        table = self.ESRPB_MLP(self.relative_position_bias_table).view(-1, self.num_heads)
        bias = 16 * torch.sigmoid(table[self.relative_position_index.reshape(-1)].view(n, n, -1).permute(2, 0, 1))
        attn_mask = bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn_mask = (attn_mask + mask.unsqueeze(1).to(bias.dtype)).unsqueeze(0).expand(b_ // nw, -1, -1, -1, -1)
            attn_mask = attn_mask.reshape(b_, self.num_heads, n, n)
        q = F.normalize(q, dim=-1) * temperature.to(q.dtype)
        out = F.scaled_dot_product_attention(q, F.normalize(k, dim=-1), v, attn_mask=attn_mask.to(q.dtype),
                                             dropout_p=self.attn_drop.p if self.training else 0.0, scale=1.0)
        out = out.transpose(1, 2).reshape(b_, n, c)
        return self.proj_drop(torch.cat([self.proj1(out[..., : c // 2]), self.proj2(out[..., c // 2:])], dim=-1))


class GRSAB(nn.Module):
    """A GRSA block: (shifted) window attention and the FFN, each post-normed; ``bi`` (its index in the group)
    turns the window every two blocks, as neosr (the shift keeps the group's orientation)."""

    def __init__(self, dim: int, num_heads: int, window_size: Sequence[int] = (8, 32),
                 shift_size: Sequence[int] = (4, 16), mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm, bi: int = 0,
                 img_size: Pair = (64, 64)) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.img_size = img_size
        wh, ww = window_size
        self.window_size: Pair = (ww, wh) if (bi // 2) % 2 == 1 else (wh, ww)
        self.shift_size: Pair = (shift_size[0], shift_size[1])
        self.mlp_ratio = mlp_ratio
        self.norm1 = norm_layer(dim)
        self.attn = GRSA(dim, self.window_size, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                         attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = FFN(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        mask = _host_buffers(self.window_size, self.shift_size, (img_size[0], img_size[1]))[2]
        self.register_buffer("attn_mask", None if mask is None else _here(mask))

    def forward(self, x: torch.Tensor, x_size: Pair) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        shifted = self.shift_size[0] > 0
        y = x.view(b, h, w, c)
        if shifted:
            y = torch.roll(y, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        wh, ww = self.window_size
        mask = grformer_mask(h, w, self.window_size, self.shift_size, x.device) if shifted else None
        y = self.attn(_windows(y, self.window_size).reshape(-1, wh * ww, c), mask)
        y = _unwindows(y.reshape(-1, wh, ww, c), self.window_size, h, w)
        if shifted:
            y = torch.roll(y, shifts=self.shift_size, dims=(1, 2))
        x = x + self.drop_path(self.norm1(y.reshape(b, h * w, c)))
        return x + self.drop_path(self.norm2(self.mlp(x, x_size)))


class GRSAB_Group(nn.Module):  # noqa: N801 - neosr's class name
    """``depth`` GRSA blocks (every second shifted by half the window), then a 3x3 conv with a shortcut."""

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: Sequence[int], mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float | Sequence[float] = 0.0, norm_layer: type[nn.Module] = nn.LayerNorm,
                 img_size: Pair = (64, 64)) -> None:
        super().__init__()
        self.dim = dim
        self.depth = depth
        rates = block_drop_rates(drop_path, depth)
        half = (window_size[0] // 2, window_size[1] // 2)
        self.blocks = nn.ModuleList([
            GRSAB(dim, num_heads, window_size, (0, 0) if i % 2 == 0 else half, mlp_ratio=mlp_ratio,
                  qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop, drop_path=rates[i],
                  norm_layer=norm_layer, bi=i, img_size=img_size)
            for i in range(depth)])
        self.conv = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: torch.Tensor, x_size: Pair) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, x_size)
        return x + to_tokens(self.conv(to_feature_map(x, *x_size)))


@ARCH_REGISTRY.register()
class GRFormer(SwinSRBase):
    """GRFormer (neosr's ``grformer``; presets ``grformer_medium``, ``grformer_large``).

    Args (neosr's names and defaults, except ``upscale``: neosr takes its option file's scale): img_size (the
    stored masks' size), in_chans, embed_dim (even, divisible by each head count), depths, num_heads (one per
    group), window_size ((rows, columns); turned every two blocks), mlp_ratio, qkv_bias / qk_scale / ape /
    patch_norm (accepted, unused, as in neosr), drop_rate, attn_drop_rate, drop_path_rate, norm_layer, upscale,
    img_range. The reconstruction is one conv to ``in_chans * upscale**2`` and a pixel shuffle; the input is
    shifted by 0.5 per RGB channel (neosr's mean).

    grformer_medium: embed_dim 180, 6 groups of depth 6 and 6 heads; grformer_large: 12 groups.
    """

    def __init__(self, img_size: int = 64, in_chans: int = 3, embed_dim: int = 60,
                 depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (3, 3, 3, 3),
                 window_size: Sequence[int] = (8, 32), mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, upscale: int = 4, img_range: float = 1.0) -> None:
        super().__init__()
        window = _check_grformer_args(img_size, embed_dim, depths, num_heads, window_size, upscale)
        self.window_size = window
        self.tile_multiple: int = math.lcm(*window)
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, "pixelshuffledirect")
        self.mean = torch.full((1, 3, 1, 1), 0.5) if in_chans == 3 else torch.zeros(1, 1, 1, 1)  # neosr's
        self.ape = ape
        self.patch_norm = patch_norm
        self.mlp_ratio = mlp_ratio
        self.pos_drop = nn.Dropout(p=drop_rate)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(GRSAB_Group(embed_dim, depth, num_heads[i], window, mlp_ratio=mlp_ratio,
                                           qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate,
                                           attn_drop=attn_drop_rate, drop_path=rates[start:start + depth],
                                           norm_layer=norm_layer, img_size=(img_size, img_size)))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1)
        self.init_reconstruction(embed_dim, in_chans, upscale)
        self.init_swin_weights()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The attention body on a (b, embed_dim, h, w) map whose sides are multiples of ``tile_multiple``."""
        x_size = (x.shape[2], x.shape[3])
        x = self.pos_drop(to_tokens(x))
        for layer in self.layers:
            x = layer(x, x_size)
        return to_feature_map(self.norm(x), *x_size)


def _check_grformer_args(img_size: int, embed_dim: int, depths: Sequence[int], num_heads: Sequence[int],
                         window_size: Sequence[int], upscale: int) -> Pair:
    """Refuse arguments neosr's GRFormer cannot run; return the window as a pair."""
    check_upscale(upscale)
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"GRFormer: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per group")
    if (not isinstance(window_size, Sequence) or len(window_size) != 2
            or not all(isinstance(v, int) and v >= 2 for v in window_size)):
        raise ArchArgumentError("window_size", f"GRFormer: window_size must be two integers >= 2 (rows, columns), "
                                f"got {window_size!r}")
    if embed_dim % 2:
        raise ArchArgumentError("embed_dim", f"GRFormer: embed_dim must be even (two channel halves), got {embed_dim}")
    for heads in num_heads:
        if heads < 1 or embed_dim % heads:
            raise ArchArgumentError("num_heads", f"GRFormer: embed_dim {embed_dim} is not divisible by {heads} heads")
    window = (window_size[0], window_size[1])
    if img_size % math.lcm(*window):
        raise ArchArgumentError("img_size", f"GRFormer: img_size {img_size} must be a multiple of both window "
                                f"sides {window} (the stored masks are laid out for it)")
    return window


__all__ = ["FFN", "GRFormer", "GRSA", "GRSAB", "GRSAB_Group", "grformer_mask", "log_spaced_offsets"]


register_presets("GRFormer", scale_arg="upscale", source="neosr", presets={
    "grformer": {},  # neosr's name: the class defaults, the top-level scale
    "grformer_medium": {"img_size": 64, "depths": (6,) * 6, "embed_dim": 180, "num_heads": (6,) * 6},
    "grformer_large": {"img_size": 64, "depths": (6,) * 12, "embed_dim": 180, "num_heads": (6,) * 12},
})


def _recognise(s: StateShapes) -> list[dict]:
    """GRFormer from its tensors: width and channels from the first conv, blocks per group, heads from each
    group's position MLP, the window from the first block's offset table, ``img_size`` from a shifted block's
    stored mask (else 64), the MLP ratio and the scale from the one-step upsampler."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    table = s.shape("layers.0.blocks.0.attn.relative_position_bias_table")
    if len(table) != 4:
        raise NotThisFamily("relative_position_bias_table is not an offset grid")
    window = [(table[1] + 1) // 2, (table[2] + 1) // 2]
    groups = s.indices("layers.")
    out = s.dim("upsample.0.weight", 0)
    scale = math.isqrt(out // cin)
    if scale * scale * cin != out:
        raise NotThisFamily("upsample.0 is no pixel shuffle of the input channels")
    opt = {"in_chans": cin, "embed_dim": embed, "depths": [s.count(f"layers.{i}.blocks.") for i in groups],
           "num_heads": [s.dim(f"layers.{i}.blocks.0.attn.ESRPB_MLP.2.weight", 0) for i in groups],
           "window_size": window, "mlp_ratio": clean(s.dim("layers.0.blocks.0.mlp.fc1.weight", 0) / embed),
           "upscale": scale}
    if "layers.0.blocks.1.attn_mask" in s:
        windows = s.dim("layers.0.blocks.1.attn_mask", 0)
        opt["img_size"] = math.isqrt(windows * window[0] * window[1])
    return [opt]


register_recogniser("GRFormer", _recognise)
