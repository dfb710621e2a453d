"""SRFormer: Permuted Self-Attention for Single Image Super-Resolution (Zhou et al., ICCV 2023).

SwinIR's layout (shallow conv, residual groups of window-attention blocks with a conv and a skip, norm, long
skip, reconstruction) with two changes in each block: permuted self-attention (PSA), where the queries are the
``window_size`` x ``window_size`` tokens of a window but keys and values come from a ``window_size / 2`` square
grid whose tokens each carry the channels of a 2x2 token patch (the kv projection halves the width first), with a
relative-position bias between each query's half-resolution position and each key; and a ConvFFN, an MLP with a
5x5 depth-wise conv (plus GELU) added to its hidden tokens.

Module names, buffers (``aligned_relative_position_index``, ``attn_mask``) and constructor arguments follow
spandrel_extra_arches' ``SRFormer`` as traiNNer-redux builds it, so its checkpoints load with ``strict=True`` and
give the same output. The shifted-window mask is computed for the actual input size on every call; the
``attn_mask`` buffer (for ``img_size``) is kept for the checkpoints' keys.

Size requirement: the input is reflect-padded (edge-replicated past what reflection reaches) to a multiple of
``window_size`` inside forward and the output cropped (``tile_multiple``). ``window_size`` must be even.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    PatchEmbed,
    PatchUnEmbed,
    ShiftedWindowStage,
    WindowBlockBase,
    relative_position_index,
    residual_conv,
    to_2tuple,
    window_attention,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.swinir_arch import SwinIR, swin_sr_arguments
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


def _region(n: int, win: int, shift: int, device: torch.device | None) -> torch.Tensor:
    """0 / 1 / 2 label of each row (column) after a cyclic shift: before the last window, in it, wrapped around."""
    idx = torch.arange(n, device=device)
    return (idx >= n - win).long() + (idx >= n - shift).long()


def _window_labels(h: int, w: int, win: int, shift: int, device: torch.device | None) -> torch.Tensor:
    label = _region(h, win, shift, device)[:, None] * 3 + _region(w, win, shift, device)[None, :]
    return label.view(h // win, win, w // win, win).permute(0, 2, 1, 3).reshape(-1, win * win)


def permuted_window_mask(h: int, w: int, window_size: int, shift_size: int, device: torch.device | None = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask (windows, ws*ws, (ws/2)**2) of 0 / -100 for shifted PSA on an ``h x w`` map: a query and a
    key of different regions (queries on the full grid, keys on the half-resolution grid, where the wrapped band
    is ``ceil(shift_size / 2)`` wide, as in the original) must not attend."""
    half = window_size // 2
    queries = _window_labels(h, w, window_size, shift_size, device)
    keys = _window_labels(h // 2, w // 2, half, -((-shift_size) // 2), device)
    blocked = queries.unsqueeze(2) != keys.unsqueeze(1)
    zeros = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    return torch.where(blocked, torch.full_like(zeros, -100.0), zeros)


class PSA(nn.Module):
    """Permuted self-attention in one window: full-resolution queries (``q``), keys / values (``kv``, half the
    width) regrouped onto a half-resolution grid, relative-position bias, projection (``proj``)."""

    def __init__(self, dim: int, window_size: tuple[int, int], num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 squeeze_dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim
        # the width of each token's keys / values (SRFormerV2's ``squeeze_dim``; SRFormer's is a quarter of dim):
        # a 2x2 patch's keys are 4 of them, so attention runs at 4 * squeeze_dim channels
        self.squeeze_dim = dim // 4 if squeeze_dim is None else squeeze_dim
        self.window_size = window_size
        self.permuted_window_size = (window_size[0] // 2, window_size[1] // 2)
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        ph, pw = self.permuted_window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ph - 1) * (2 * pw - 1), num_heads))
        # each full-resolution query (r, c) takes the bias row of the half-resolution token (r // 2, c // 2)
        base = relative_position_index((ph, pw)).view(ph, pw, ph * pw)
        rows, cols = torch.arange(2 * ph) // 2, torch.arange(2 * pw) // 2
        self.register_buffer("aligned_relative_position_index",
                             base[rows[:, None], cols[None, :]].reshape(4 * ph * pw, ph * pw))
        width = 4 * self.squeeze_dim
        self.kv = nn.Linear(dim, 2 * self.squeeze_dim, bias=qkv_bias)
        self.q = nn.Linear(dim, width, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(width, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        bw, n, _ = x.shape
        sq = self.squeeze_dim
        heads, d = self.num_heads, 4 * sq // self.num_heads
        ph, pw = self.permuted_window_size
        # (bw, 2ph*2pw, 2sq) -> per 2x2 patch of tokens: [k | v] each of its 4 tokens' sq channels -> 4sq channels
        kv = self.kv(x).view(bw, ph, 2, pw, 2, 2, sq).permute(5, 0, 1, 3, 2, 4, 6)
        kv = kv.reshape(2, bw, ph * pw, heads, d).transpose(2, 3)
        q = self.q(x).view(bw, n, heads, d).transpose(1, 2)
        bias = self.relative_position_bias_table[self.aligned_relative_position_index.view(-1)]
        bias = bias.view(n, ph * pw, heads).permute(2, 0, 1)
        out = window_attention(q, kv[0], kv[1], bias, mask, scale=self.scale,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(bw, n, 4 * sq)))


class dwconv(nn.Module):  # noqa: N801 (the checkpoints' module name)
    """5x5 depth-wise conv + GELU on tokens (key ``depthwise_conv.0``)."""

    def __init__(self, hidden_features: int) -> None:
        super().__init__()
        self.hidden_features = hidden_features
        self.depthwise_conv = nn.Sequential(
            nn.Conv2d(hidden_features, hidden_features, 5, 1, 2, groups=hidden_features), nn.GELU())

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        b = x.shape[0]
        fmap = x.transpose(1, 2).reshape(b, self.hidden_features, x_size[0], x_size[1])
        return self.depthwise_conv(fmap).flatten(2).transpose(1, 2)


class ConvFFN(nn.Module):
    """fc1 -> GELU -> (+ depth-wise conv of itself) -> fc2, dropout after each half."""

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.dwconv = dwconv(hidden_features)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        x = self.act(self.fc1(x))
        x = self.drop(x + self.dwconv(x, x_size))
        return self.drop(self.fc2(x))


class PSABlock(WindowBlockBase):
    """Pre-norm (shifted-)window PSA and ConvFFN, each with a residual. A window not smaller than
    ``input_resolution`` shrinks to it, without shift (as the original; this decides the parameter shapes), unless
    ``shrink_window`` is off (SRFormerV2 keeps window and shift). ``squeeze_dim``: see ``PSA``."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm,
                 squeeze_dim: int | None = None, shrink_window: bool = True) -> None:
        super().__init__()
        self.init_block_attrs(dim, input_resolution, num_heads, window_size, shift_size, mlp_ratio)
        if shrink_window and min(input_resolution) <= window_size:
            self.shift_size = 0
            self.window_size = min(input_resolution)
        if self.window_size % 2:
            raise ArchArgumentError("window_size", f"SRFormer's permuted windows need an even window, got "
                                    f"{self.window_size}")
        self.norm1 = norm_layer(dim)
        self.attn = PSA(dim, to_2tuple(self.window_size), num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                        attn_drop=attn_drop, proj_drop=drop, squeeze_dim=squeeze_dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = ConvFFN(dim, int(dim * mlp_ratio), drop=drop, act_layer=act_layer)
        mask = None
        if self.shift_size > 0:
            h, w = input_resolution
            mask = permuted_window_mask(h, w, self.window_size, self.shift_size)
        self.register_buffer("attn_mask", mask)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift = self.window_size, self.shift_size
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        mask = None
        if shift > 0:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
            mask = permuted_window_mask(h, w, ws, shift, x.device, x.dtype)
        windows = self.attn(window_partition(x, ws).view(-1, ws * ws, c), mask=mask)
        x = window_reverse(windows.view(-1, ws, ws, c), ws, h, w)
        if shift > 0:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = shortcut + self.drop_path(x.reshape(b, h * w, c))
        return x + self.drop_path(self.mlp(self.norm2(x), x_size))


class PSALayer(ShiftedWindowStage):
    """``depth`` PSA blocks, alternating plain and shifted windows."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 squeeze_dim: int | None = None) -> None:
        super().__init__()
        self.init_blocks(dim, input_resolution, depth, window_size, drop_path, use_checkpoint,
                         lambda shift, rate: PSABlock(
                             dim, input_resolution, num_heads, window_size=window_size, shift_size=shift,
                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                             attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer, squeeze_dim=squeeze_dim))
        self.downsample = None

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        return self.run_blocks(x, x_size)


class PSA_Group(nn.Module):  # noqa: N801 (the original's name)
    """Residual group: PSA blocks, a conv on the feature map, and a shortcut (SwinIR's RSTB keys). The blocks are a
    ``layer_class`` (SRFormerV2's interleaves Swin blocks), given ``squeeze_dim`` (see ``PSA``)."""

    layer_class: ClassVar[type[nn.Module]] = PSALayer

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, downsample: type[nn.Module] | None = None,
                 use_checkpoint: bool = False, img_size: int | Sequence[int] = 224,
                 patch_size: int | Sequence[int] = 4, resi_connection: str = "1conv",
                 squeeze_dim: int | None = None) -> None:
        super().__init__()
        del downsample  # SRFormer has none
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = self.layer_class(
            dim, input_resolution, depth, num_heads, window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
            qk_scale=qk_scale, drop=drop, attn_drop=attn_drop, drop_path=drop_path, norm_layer=norm_layer,
            use_checkpoint=use_checkpoint, squeeze_dim=squeeze_dim)
        self.conv = residual_conv(dim, resi_connection)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans=0, embed_dim=dim, norm_layer=None)
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=0, embed_dim=dim, norm_layer=None)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        feat = self.patch_unembed(self.residual_group(x, x_size), x_size)
        return self.patch_embed(self.conv(feat)) + x


@ARCH_REGISTRY.register()
class SRFormer(SwinIR):
    """SRFormer: SwinIR's network with PSA groups (arguments, names and defaults of the original; ``img_size`` is
    rounded up to a multiple of ``window_size`` as the original's patch embedding does). ``window_size`` must be
    even; ``embed_dim`` a multiple of 4 and of every ``num_heads``."""

    stage_class = PSA_Group

    def __init__(self, *, img_size: int = 64, patch_size: int = 1, in_chans: int = 3, embed_dim: int = 96,
                 depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6), window_size: int = 7,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm,
                 ape: bool = False, patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 1,
                 img_range: float = 1.0, upsampler: str = "", resi_connection: str = "1conv",
                 rgb_mean: Sequence[float] | None = None) -> None:
        if not isinstance(window_size, int) or window_size < 2:
            raise ArchArgumentError("window_size", f"SRFormer needs an even window_size >= 2, got {window_size!r}")
        if embed_dim % 4 or any(embed_dim % h for h in num_heads):
            raise ArchArgumentError("embed_dim", f"SRFormer needs embed_dim ({embed_dim}) to be a multiple of 4 and "
                                    f"of each of num_heads {list(num_heads)}")
        if (upsampler or "") not in ("pixelshuffle", "pixelshuffledirect", "nearest+conv", ""):
            raise ArchArgumentError("upsampler", f"SRFormer: unknown upsampler {upsampler!r}; use pixelshuffle, "
                                    "pixelshuffledirect, nearest+conv or '' (scale 1)")
        if resi_connection not in ("1conv", "3conv"):
            raise ArchArgumentError("resi_connection", f"SRFormer: unknown resi_connection {resi_connection!r}; "
                                    "use '1conv' or '3conv'")
        rounded = math.ceil(img_size / window_size) * window_size
        super().__init__(img_size=rounded, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                         depths=depths, num_heads=num_heads, window_size=window_size, mlp_ratio=mlp_ratio,
                         qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                         drop_path_rate=drop_path_rate, norm_layer=norm_layer, ape=ape, patch_norm=patch_norm,
                         use_checkpoint=use_checkpoint, upscale=upscale, img_range=img_range, upsampler=upsampler,
                         resi_connection=resi_connection, rgb_mean=rgb_mean)


__all__ = ["SRFormer", "PSA", "PSABlock", "PSA_Group", "permuted_window_mask"]

_SRF = {"upscale": 4, "embed_dim": 180, "mlp_ratio": 2.0}
register_presets("SRFormer", scale_arg="upscale", presets={
    "srformer": {**_SRF, "img_size": 48, "depths": (6,) * 6, "num_heads": (6,) * 6, "window_size": 24,
                 "upsampler": "pixelshuffle"},
    "srformer_light": {**_SRF, "img_size": 64, "depths": (6,) * 4, "num_heads": (6,) * 4, "window_size": 16,
                       "upsampler": "pixelshuffledirect"},
})

# neosr's name (tests/test_neosr_names.py checks it against the network neosr builds)
register_presets("SRFormer", scale_arg="upscale", source="neosr", presets={
    # 10.54 M parameters at x4
    "srformer_medium": {"img_size": 48, "embed_dim": 180, "depths": (6,) * 6, "num_heads": (6,) * 6,
                        "window_size": 24, "mlp_ratio": 2.0, "upsampler": "pixelshuffle",
                        "rgb_mean": (0.5,) * 3},
})


def _recognise(s: StateShapes) -> list[dict]:
    """SRFormer from its tensors (``swin_sr_arguments``; the permuted window's bias table has (window - 1) ** 2
    rows: half-size windows)."""
    def window(block: str) -> tuple[int, int]:
        rows, heads = s.shape(f"{block}attn.relative_position_bias_table")
        return round(rows**0.5) + 1, heads

    s.shape("layers.0.residual_group.blocks.0.attn.kv.weight")
    return swin_sr_arguments(s, window, "q.bias")


register_recogniser("SRFormer", _recognise)
