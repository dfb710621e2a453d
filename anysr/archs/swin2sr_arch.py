"""Swin2SR: SwinV2 transformer for compressed image super-resolution and restoration (Conde, Choi, Burchi and
Timofte, ECCV 2022 workshops).

SwinIR's layout (shallow conv, residual Swin transformer blocks, reconstruction) with SwinV2's blocks: scaled
cosine attention (a learned, clamped temperature per head), a continuous relative-position bias produced by a
small MLP from log-spaced coordinates (``16 * sigmoid``), and post-normalisation (the norms follow the
attention and the MLP inside each residual branch). Every token embedding carries a 1x1 projection.

Constructor arguments, module names and buffers follow spandrel 0.4.2's ``Swin2SR`` (the authors' names), so
released checkpoints load with ``strict=True``. Upsamplers: 'pixelshuffle' (classical SR), 'pixelshuffledirect'
(lightweight), 'nearest+conv' (real-world, x4 only), 'pixelshuffle_aux' (compressed-input SR, with a bicubic
branch) and '' (scale 1: JPEG / denoising).

Size requirement: none for the caller; inputs are padded at the bottom / right to a multiple of the window
(reflect, then replicate where reflect cannot reach) inside ``forward`` and the output is cropped back. The
shifted-window mask is computed for the padded size on the input's device; the ``attn_mask`` buffer is kept
only for the checkpoints' keys.
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
    Mlp,
    PatchUnEmbed,
    ShiftedWindowStage,
    SwinSRBase,
    Upsample,
    WindowBlockBase,
    _PatchGeometry,
    check_upscale,
    drop_path_rates,
    nearest_upsample,
    pad_to_multiple,
    relative_position_index,
    residual_conv,
    shifted_window_mask,
    to_2tuple,
    window_attention,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.swinir_arch import swin_sr_arguments
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect", "nearest+conv", "pixelshuffle_aux", "")
LOGIT_SCALE_MAX = math.log(100.0)  # the temperature is clamped at 1 / 0.01


def log_spaced_coords(window_size: tuple[int, int], pretrained_window_size: tuple[int, int] = (0, 0)
                      ) -> torch.Tensor:
    """SwinV2's input to the position-bias MLP: (1, 2wh-1, 2ww-1, 2) offsets (row, column), scaled to [-8, 8] by
    the (pretraining) window and mapped through ``sign(t) * log2(1 + |t|) / 3``."""
    wh, ww = window_size
    ph, pw = pretrained_window_size
    rows = torch.arange(1 - wh, wh, dtype=torch.float32) / ((ph if ph > 0 else wh) - 1)
    cols = torch.arange(1 - ww, ww, dtype=torch.float32) / ((pw if pw > 0 else ww) - 1)
    table = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).unsqueeze(0) * 8
    return torch.sign(table) * torch.log2(table.abs() + 1.0) / 3.0


class WindowAttentionV2(nn.Module):
    """Scaled cosine attention inside windows with a continuous relative-position bias.

    Parameters (spandrel's names): ``logit_scale`` (heads, 1, 1), ``cpb_mlp`` (2 -> 512 -> heads), ``qkv`` (no
    bias of its own), ``q_bias`` / ``v_bias`` (the key gets none), ``proj``; buffers ``relative_coords_table`` and
    ``relative_position_index``.
    """

    def __init__(self, dim: int, window_size: tuple[int, int], num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0,
                 pretrained_window_size: tuple[int, int] = (0, 0)) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.pretrained_window_size = pretrained_window_size
        self.num_heads = num_heads
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512, bias=True), nn.ReLU(inplace=True),
                                     nn.Linear(512, num_heads, bias=False))
        self.register_buffer("relative_coords_table", log_spaced_coords(window_size, pretrained_window_size))
        self.register_buffer("relative_position_index", relative_position_index(window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = None
            self.v_bias = None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def position_bias(self) -> torch.Tensor:
        """(heads, n, n) bias, ``16 * sigmoid`` of the MLP's output for each query / key offset."""
        n = self.relative_position_index.shape[0]
        table = self.cpb_mlp(self.relative_coords_table).reshape(-1, self.num_heads)
        bias = table[self.relative_position_index.reshape(-1)].view(n, n, self.num_heads).permute(2, 0, 1)
        return 16 * torch.sigmoid(bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (windows * b, n, c); mask: (windows, n, n) of 0 / -100 or None."""
        b_, n, c = x.shape
        bias = None
        if self.q_bias is not None:
            bias = torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias).reshape(b_, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        temperature = torch.clamp(self.logit_scale, max=LOGIT_SCALE_MAX).exp()
        q = F.normalize(q, dim=-1) * temperature.to(q.dtype)
        out = window_attention(q, F.normalize(k, dim=-1), v, self.position_bias(), mask, scale=1.0,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, c)))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, window_size={self.window_size}, "
                f"pretrained_window_size={self.pretrained_window_size}, num_heads={self.num_heads}")


class SwinV2Block(WindowBlockBase):
    """(Shifted-)window cosine attention and an MLP, each post-normed inside its residual branch.

    A window not smaller than ``input_resolution`` shrinks to it and drops the shift (as the authors' code; this
    decides the parameter shapes).
    """

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm, pretrained_window_size: int = 0) -> None:
        super().__init__()
        self.init_block_attrs(dim, input_resolution, num_heads, window_size, shift_size, mlp_ratio)
        if min(input_resolution) <= window_size:
            self.shift_size = 0
            self.window_size = min(input_resolution)
        if self.window_size < 2:
            raise ArchArgumentError("window_size", f"Swin2SR: windows must be at least 2 pixels, got "
                                    f"{self.window_size} (window_size {window_size}, img_size / patch_size "
                                    f"{input_resolution})")
        if not 0 <= self.shift_size < self.window_size:
            raise ArchArgumentError("window_size", f"shift {self.shift_size} must be in [0, window "
                                    f"{self.window_size})")
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttentionV2(dim, to_2tuple(self.window_size), num_heads, qkv_bias=qkv_bias,
                                      attn_drop=attn_drop, proj_drop=drop,
                                      pretrained_window_size=to_2tuple(pretrained_window_size))
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        mask = None
        if self.shift_size > 0:  # for the checkpoints' keys (img_size rounded up to the window)
            h, w = (math.ceil(n / self.window_size) * self.window_size for n in input_resolution)
            mask = shifted_window_mask(h, w, self.window_size, self.shift_size)
        self.register_buffer("attn_mask", mask)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift = self.window_size, self.shift_size
        y = x.view(b, h, w, c)
        mask = None
        if shift > 0:
            y = torch.roll(y, shifts=(-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask(h, w, ws, shift, x.device, x.dtype)
        windows = self.attn(window_partition(y, ws).view(-1, ws * ws, c), mask=mask)
        y = window_reverse(windows.view(-1, ws, ws, c), ws, h, w)
        if shift > 0:
            y = torch.roll(y, shifts=(shift, shift), dims=(1, 2))
        x = x + self.drop_path(self.norm1(y.reshape(b, h * w, c)))
        return x + self.drop_path(self.norm2(self.mlp(x)))


class BasicLayer(ShiftedWindowStage):
    """``depth`` SwinV2 blocks, plain and shifted windows in turn."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int,
                 window_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 pretrained_window_size: int = 0) -> None:
        super().__init__()
        self.init_blocks(dim, input_resolution, depth, window_size, drop_path, use_checkpoint,
                         lambda shift, rate: SwinV2Block(
                             dim, input_resolution, num_heads, window_size=window_size, shift_size=shift,
                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop, attn_drop=attn_drop,
                             drop_path=rate, norm_layer=norm_layer, pretrained_window_size=pretrained_window_size))
        self.downsample = None

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        return self.run_blocks(x, x_size)


class ProjectedPatchEmbed(_PatchGeometry):
    """(b, c, h, w) -> (b, h*w, embed_dim) tokens through a ``patch_size`` convolution ``proj`` (1x1 in every
    released model), with an optional ``norm``."""

    def __init__(self, img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 in_chans: int = 3, embed_dim: int = 96, norm_layer: type[nn.Module] | None = None) -> None:
        super().__init__(img_size, patch_size, in_chans, embed_dim)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        return self.norm(x) if self.norm is not None else x


class RSTB(nn.Module):
    """Residual Swin transformer block: a BasicLayer, a conv on the feature map, a projected re-embedding and a
    shortcut."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int,
                 window_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 resi_connection: str = "1conv") -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = BasicLayer(dim, input_resolution, depth, num_heads, window_size, mlp_ratio=mlp_ratio,
                                         qkv_bias=qkv_bias, drop=drop, attn_drop=attn_drop, drop_path=drop_path,
                                         norm_layer=norm_layer, use_checkpoint=use_checkpoint)
        self.conv = residual_conv(dim, resi_connection)
        self.patch_embed = ProjectedPatchEmbed(img_size, patch_size, in_chans=dim, embed_dim=dim)
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=dim, embed_dim=dim)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        feat = self.patch_unembed(self.residual_group(x, x_size), x_size)
        return self.patch_embed(self.conv(feat)) + x


@ARCH_REGISTRY.register()
class Swin2SR(SwinSRBase):
    """Swin2SR (arguments and defaults of spandrel 0.4.2's class): img_size (training patch; sets the
    ``attn_mask`` buffers and shrinks the window when not larger), patch_size (1: the only size the network can
    run), in_chans, embed_dim, depths, num_heads, window_size, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate,
    drop_path_rate, norm_layer, ape, patch_norm, use_checkpoint, upscale, img_range, upsampler (one of
    ``UPSAMPLERS``; None is ''), resi_connection ('1conv' / '3conv').
    """

    def __init__(self, *, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1,
                 in_chans: int = 3, embed_dim: int = 96, depths: Sequence[int] = (6, 6, 6, 6),
                 num_heads: Sequence[int] = (6, 6, 6, 6), window_size: int = 7, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2, img_range: float = 1.0,
                 upsampler: str | None = "", resi_connection: str = "1conv") -> None:
        super().__init__()
        upsampler = upsampler or ""
        _check_args(upsampler, resi_connection, depths, num_heads, patch_size, upscale, window_size, embed_dim)
        num_feat = 64
        self.window_size = window_size
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler)
        self.mlp_ratio = mlp_ratio
        self.ape = ape
        self.patch_norm = patch_norm
        self.patch_embed = ProjectedPatchEmbed(img_size, patch_size, in_chans=embed_dim, embed_dim=embed_dim,
                                               norm_layer=norm_layer if patch_norm else None)
        self.patches_resolution = self.patch_embed.patches_resolution
        resolution = (self.patches_resolution[0], self.patches_resolution[1])
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=embed_dim, embed_dim=embed_dim)
        if ape:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self.pos_drop = nn.Dropout(p=drop_rate)

        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RSTB(embed_dim, resolution, depth, num_heads[i], window_size, mlp_ratio=mlp_ratio,
                                    qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate,
                                    drop_path=rates[start:start + depth], norm_layer=norm_layer,
                                    use_checkpoint=use_checkpoint, img_size=img_size, patch_size=patch_size,
                                    resi_connection=resi_connection))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)

        if upsampler == "pixelshuffle_aux":
            self.conv_bicubic = nn.Conv2d(in_chans, num_feat, 3, 1, 1)
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.conv_aux = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
            self.conv_after_aux = nn.Sequential(nn.Conv2d(3, num_feat, 3, 1, 1), nn.LeakyReLU(inplace=True))
            self.upsample = Upsample(upscale, num_feat)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
        elif upsampler == "nearest+conv":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)
        elif not upsampler:
            self.conv_last = nn.Conv2d(embed_dim, in_chans, 3, 1, 1)
        else:
            self.init_reconstruction(embed_dim, in_chans, upscale, resolution, num_feat)
        self.init_swin_weights()

    @property
    def tile_multiple(self) -> int:
        """Inputs are padded to a multiple of this (the largest window the blocks use)."""
        return max((blk.window_size for layer in self.layers for blk in layer.residual_group.blocks), default=1)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Transformer body on a (b, embed_dim, h, w) map whose size is a multiple of the window."""
        x_size = (x.shape[2], x.shape[3])
        x = self.patch_embed(x)
        if self.ape:
            x = x + self.absolute_pos_embed
        x = self.pos_drop(x)
        for layer in self.layers:
            x = layer(x, x_size)
        return self.patch_unembed(self.norm(x), x_size)

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsampler == "nearest+conv":
            x = self.conv_before_upsample(self.deep_features(self.conv_first(x)))
            x = self.lrelu(self.conv_up1(nearest_upsample(x, 2)))
            x = self.lrelu(self.conv_up2(nearest_upsample(x, 2)))
            return self.conv_last(self.lrelu(self.conv_hr(x)))
        if not self.upsampler:
            return x + self.conv_last(self.deep_features(self.conv_first(x)))
        return super().reconstruct(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsampler != "pixelshuffle_aux":
            return super().forward(x)
        return self._forward_aux(x)

    def _forward_aux(self, x: torch.Tensor) -> torch.Tensor:
        """'pixelshuffle_aux': the features' upsampled auxiliary image plus a bicubic branch. As in the
        reference, the bicubic branch resizes the *padded* input to the unpadded output size."""
        h, w = x.shape[-2:]
        s = self.upscale
        x, _, _ = pad_to_multiple(x, self.tile_multiple)
        mean = self.mean.to(dtype=x.dtype)
        x = (x - mean) * self.img_range
        bicubic = self.conv_bicubic(F.interpolate(x, size=(h * s, w * s), mode="bicubic", align_corners=False))
        feat = self.conv_before_upsample(self.deep_features(self.conv_first(x)))
        up = self.upsample(self.conv_after_aux(self.conv_aux(feat)))[:, :, : h * s, : w * s]
        return self.conv_last(up + bicubic) / self.img_range + mean


def _check_args(upsampler: str, resi_connection: str, depths: Sequence[int], num_heads: Sequence[int],
                patch_size: int | Sequence[int], upscale: int, window_size: int, embed_dim: int) -> None:
    if upsampler not in UPSAMPLERS:
        extra = " ('pixelshuffle_hf' returns three images and is not supported)" if upsampler == "pixelshuffle_hf" \
            else ""
        raise ArchArgumentError("upsampler", f"Swin2SR: unknown upsampler {upsampler!r}{extra}; use one of "
                                f"{UPSAMPLERS}")
    if resi_connection not in ("1conv", "3conv"):
        raise ArchArgumentError("resi_connection", f"Swin2SR: unknown resi_connection {resi_connection!r}; use "
                                "'1conv' or '3conv'")
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"Swin2SR: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per stage")
    if any(embed_dim % h for h in num_heads):
        raise ArchArgumentError("num_heads", f"Swin2SR: embed_dim {embed_dim} is not divisible by every head "
                                f"count {list(num_heads)}")
    if to_2tuple(patch_size) != (1, 1):
        raise ArchArgumentError("patch_size", f"Swin2SR: only patch_size 1 can run (the body keeps the input's "
                                f"size), got {patch_size!r}")
    if not isinstance(window_size, int) or window_size < 2:
        raise ArchArgumentError("window_size", f"Swin2SR: window_size must be an integer >= 2, got {window_size!r}")
    if upsampler == "nearest+conv" and upscale != 4:
        raise ArchArgumentError("upscale", f"Swin2SR: upsampler 'nearest+conv' supports upscale 4 only, got "
                                f"{upscale!r}")
    if upsampler in ("pixelshuffle", "pixelshuffle_aux"):
        check_upscale(upscale)
    elif upsampler == "pixelshuffledirect" and (not isinstance(upscale, int) or upscale < 1):
        raise ArchArgumentError("upscale", f"Swin2SR: upscale must be a positive integer, got {upscale!r}")


__all__ = ["Swin2SR", "SwinV2Block", "WindowAttentionV2"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("Swin2SR", scale_arg="upscale", presets={
    # 28.79 M parameters at x4
    "swin2sr_l": {
        "upscale": 4, "embed_dim": 240, "depths": (6,) * 9, "num_heads": (8,) * 9, "window_size": 8,
        "mlp_ratio": 2.0, "upsampler": "nearest+conv", "resi_connection": "3conv"
    },
    # 12.24 M parameters at x4
    "swin2sr_m": {
        "upscale": 4, "embed_dim": 180, "depths": (6,) * 6, "num_heads": (6,) * 6, "window_size": 8,
        "mlp_ratio": 2.0, "upsampler": "pixelshuffle"
    },
    # 1.02 M parameters at x4
    "swin2sr_s": {"upscale": 4, "embed_dim": 60, "window_size": 8, "mlp_ratio": 2.0, "upsampler": "pixelshuffledirect"},
})


def _recognise(s: StateShapes) -> list[dict]:
    """Swin2SR from its tensors (``swin_sr_arguments``; the window from the continuous position bias's
    coordinate table, (1, 2 * window - 1, 2 * window - 1, 2), the heads from the logit scales)."""
    def window(block: str) -> tuple[int, int]:
        return (s.dim(f"{block}attn.relative_coords_table", 1) + 1) // 2, s.dim(f"{block}attn.logit_scale", 0)

    return swin_sr_arguments(s, window, "q_bias")


register_recogniser("Swin2SR", _recognise)
