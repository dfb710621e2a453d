"""SwinIR: image restoration with shifted-window transformers (Liang et al., 2021).

Module names and buffers follow BasicSR 1.4.2, so its checkpoints load with ``strict=True`` and give
its outputs. Two cases that BasicSR's arch cannot run are handled:

* inputs whose height/width are not a multiple of the window size are reflect-padded inside
  ``forward`` and the output cropped back, exactly as BasicSR's ``SwinIRModel.test`` does around
  the network (replicate beyond what reflect can reach, where BasicSR fails);
* an ``img_size`` that is not a multiple of the window (the default 64 with window 7): BasicSR fails
  building its ``attn_mask`` buffer; here the buffer is made for ``img_size`` rounded up.

The shifted-window attention mask is computed for the actual input size on every call (on the input's
device, deterministic, no state kept); the ``attn_mask`` buffer is kept only for BasicSR's state-dict keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    Mlp,
    PatchEmbed,
    PatchUnEmbed,
    ShiftedWindowStage,
    SwinSRBase,
    WindowAttention,
    WindowBlockBase,
    drop_path_rates,
    nearest_upsample,
    residual_conv,
    shifted_window_mask,
    to_2tuple,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import (
    NotThisFamily,
    StateShapes,
    register_recogniser,
    shuffle_splits,
    upsample_scale,
    width_ratio,
)
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect", "nearest+conv", "")
RESI_CONNECTIONS = ("1conv", "3conv")


class SwinTransformerBlock(WindowBlockBase):
    """(Shifted-)window attention + MLP, each pre-normed with a residual connection.

    If ``input_resolution`` is not larger than ``window_size``, the window shrinks to it and the
    shift is dropped (as in BasicSR; this decides the parameter shapes).
    """

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.init_block_attrs(dim, input_resolution, num_heads, window_size, shift_size, mlp_ratio)
        if min(input_resolution) <= window_size:
            self.shift_size = 0
            self.window_size = min(input_resolution)
        if not 0 <= self.shift_size < self.window_size:
            raise ArchArgumentError(
                "window_size", f"shift {self.shift_size} must be in [0, window {self.window_size})"
            )
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, to_2tuple(self.window_size), num_heads, qkv_bias=qkv_bias,
                                    qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        mask = None
        if self.shift_size > 0:
            # For img_size (rounded up to a window multiple, which BasicSR cannot build at all). Kept for
            # state-dict compatibility with BasicSR; forward computes the mask for the actual size.
            h, w = (math.ceil(n / self.window_size) * self.window_size for n in input_resolution)
            mask = shifted_window_mask(h, w, self.window_size, self.shift_size)
        self.register_buffer("attn_mask", mask)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
            mask = shifted_window_mask(h, w, self.window_size, self.shift_size, x.device, x.dtype)
        else:
            mask = None
        windows = window_partition(x, self.window_size).view(-1, self.window_size * self.window_size, c)
        windows = self.attn(windows, mask=mask).view(-1, self.window_size, self.window_size, c)
        x = window_reverse(windows, self.window_size, h, w)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        x = shortcut + self.drop_path(x.reshape(b, h * w, c))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class BasicLayer(ShiftedWindowStage):
    """``depth`` Swin blocks, alternating plain and shifted windows."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int,
                 window_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float | Sequence[float] = 0.0, norm_layer: type[nn.Module] = nn.LayerNorm,
                 downsample: type[nn.Module] | None = None, use_checkpoint: bool = False) -> None:
        super().__init__()
        self.init_blocks(dim, input_resolution, depth, window_size, drop_path, use_checkpoint,
                         lambda shift, rate: SwinTransformerBlock(
                             dim, input_resolution, num_heads, window_size=window_size, shift_size=shift,
                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                             attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer))
        self.downsample = downsample(input_resolution, dim=dim, norm_layer=norm_layer) if downsample else None

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        x = self.run_blocks(x, x_size)
        return self.downsample(x) if self.downsample is not None else x


class RSTB(nn.Module):
    """Residual Swin Transformer Block: a BasicLayer, a conv on the feature map, and a shortcut."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int,
                 window_size: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float | Sequence[float] = 0.0, norm_layer: type[nn.Module] = nn.LayerNorm,
                 downsample: type[nn.Module] | None = None, use_checkpoint: bool = False,
                 img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 resi_connection: str = "1conv") -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = BasicLayer(dim, input_resolution, depth, num_heads, window_size,
                                         mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                                         attn_drop=attn_drop, drop_path=drop_path, norm_layer=norm_layer,
                                         downsample=downsample, use_checkpoint=use_checkpoint)
        self.conv = residual_conv(dim, resi_connection)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans=0, embed_dim=dim, norm_layer=None)
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=0, embed_dim=dim, norm_layer=None)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        feat = self.patch_unembed(self.residual_group(x, x_size), x_size)
        return self.patch_embed(self.conv(feat)) + x


@ARCH_REGISTRY.register()
class SwinIR(SwinSRBase):
    """SwinIR for SR (``upsampler`` 'pixelshuffle', 'pixelshuffledirect', 'nearest+conv') and for
    restoration at scale 1 (``upsampler`` '' or None).

    Args (BasicSR names and defaults): img_size (training patch size; sets the ``attn_mask`` buffer and
    shrinks the window when not larger than it), patch_size, in_chans, embed_dim, depths, num_heads,
    window_size, mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate, norm_layer,
    ape (absolute position embedding; needs inputs of exactly ``img_size``), patch_norm, use_checkpoint,
    upscale, img_range, upsampler, resi_connection ('1conv' or '3conv'), rgb_mean (RGB input mean, by default
    DIV2K's; neosr's: 0.5 each).
    """

    stage_class: ClassVar[type[nn.Module]] = RSTB  # the residual group (SRFormer swaps in its own)

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1,
                 in_chans: int = 3, embed_dim: int = 96, depths: Sequence[int] = (6, 6, 6, 6),
                 num_heads: Sequence[int] = (6, 6, 6, 6), window_size: int = 7, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False, patch_norm: bool = True,
                 use_checkpoint: bool = False, upscale: int = 2, img_range: float = 1.0,
                 upsampler: str | None = "", resi_connection: str = "1conv",
                 rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        upsampler = upsampler or ""
        if upsampler not in UPSAMPLERS:
            raise ArchArgumentError(
                "upsampler", f"SwinIR: unknown upsampler {upsampler!r}; use one of {UPSAMPLERS}"
            )
        if resi_connection not in RESI_CONNECTIONS:
            raise ArchArgumentError(
                "resi_connection",
                f"SwinIR: unknown resi_connection {resi_connection!r}; use one of {RESI_CONNECTIONS}",
            )
        if len(num_heads) != len(depths):
            raise ArchArgumentError(
                "num_heads", f"SwinIR: num_heads has {len(num_heads)} entries but depths has {len(depths)}; "
                "give one head count per stage"
            )
        if upsampler == "nearest+conv" and upscale != 4:
            raise ArchArgumentError("upscale", f"SwinIR: upsampler 'nearest+conv' supports upscale 4 only, "
                                    f"got {upscale!r}")
        num_out_ch = in_chans
        num_feat = 64
        self.window_size = window_size
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler, rgb_mean)
        self.mlp_ratio = mlp_ratio
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, norm_layer, patch_norm, ape, drop_rate)
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=embed_dim, embed_dim=embed_dim)

        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(self.make_stage(embed_dim, resolution, depth, num_heads[i], window_size,
                                    mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate,
                                    attn_drop=attn_drop_rate, drop_path=rates[start:start + depth],
                                    norm_layer=norm_layer, downsample=None, use_checkpoint=use_checkpoint,
                                    img_size=img_size, patch_size=patch_size,
                                    resi_connection=resi_connection))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)

        if upsampler == "nearest+conv":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)
        elif not upsampler:
            self.conv_last = nn.Conv2d(embed_dim, num_out_ch, 3, 1, 1)
        else:
            self.init_reconstruction(embed_dim, num_out_ch, upscale, resolution, num_feat)
        self.init_swin_weights()

    def make_stage(self, *args: Any, **kwargs: Any) -> nn.Module:
        """One residual group (``stage_class`` with SwinIR's arguments; a subclass may add its own)."""
        return self.stage_class(*args, **kwargs)

    @property
    def tile_multiple(self) -> int:
        """Inputs are padded to a multiple of this (of every window the blocks use; ``ops.tiling.TiledNetwork``)."""
        sizes = {blk.window_size for layer in self.layers for blk in layer.residual_group.blocks}
        return math.lcm(*sizes) if sizes else 1

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Transformer body on a (b, embed_dim, h, w) map whose size is a multiple of the window."""
        x_size = (x.shape[2], x.shape[3])
        x = self.embed_tokens(x)
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


__all__ = ["SwinIR", "RSTB", "SwinTransformerBlock"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SwinIR", scale_arg="upscale", fixed={"start_unshuffle": 1}, presets={
    # 28.01 M parameters at x4
    "swinir_l": {
        "upscale": 4, "embed_dim": 240, "depths": (6,) * 9, "num_heads": (8,) * 9, "window_size": 8,
        "mlp_ratio": 2.0, "upsampler": "nearest+conv", "resi_connection": "3conv"
    },
    # 11.90 M parameters at x4
    "swinir_m": {
        "upscale": 4, "img_size": 48, "embed_dim": 180, "depths": (6,) * 6, "num_heads": (6,) * 6, "window_size": 8,
        "mlp_ratio": 2.0, "upsampler": "pixelshuffle"
    },
    # 0.93 M parameters at x4
    "swinir_s": {"upscale": 4, "embed_dim": 60, "window_size": 8, "mlp_ratio": 2.0, "upsampler": "pixelshuffledirect"},
})

# neosr's names (tests/test_neosr_names.py checks them against the networks neosr builds)
register_presets("SwinIR", scale_arg="upscale", fixed={"start_unshuffle": 1}, source="neosr", presets={
    # 0.93 M parameters at x4
    "swinir_small": {"img_size": 64, "embed_dim": 60, "window_size": 8, "mlp_ratio": 2.0,
                     "upsampler": "pixelshuffledirect",
                     "rgb_mean": (0.5,) * 3},
    # 11.90 M parameters at x4
    "swinir_medium": {"img_size": 48, "embed_dim": 180, "depths": (6,) * 6, "num_heads": (6,) * 6, "window_size": 8,
                      "mlp_ratio": 2.0, "upsampler": "pixelshuffle",
                      "rgb_mean": (0.5,) * 3},
    # 28.01 M parameters at x4
    "swinir_large": {"img_size": 64, "embed_dim": 240, "depths": (6,) * 9, "num_heads": (8,) * 9, "window_size": 8,
                     "mlp_ratio": 2.0, "upsampler": "nearest+conv", "resi_connection": "3conv",
                     "rgb_mean": (0.5,) * 3},
})


def swin_sr_arguments(s: StateShapes, window: Callable[[str], tuple[int, int]], bias_key: str) -> list[dict]:
    """SwinIR-layout arguments from a file's tensors (SwinIR, SRFormer, Swin2SR): image channels and width from
    the first conv, the stages' depths from their blocks, heads and window per stage from ``window(block
    prefix)`` -> (window, heads), the MLP ratio, the qkv bias (``bias_key`` under a block's ``attn.``), the
    absolute position embedding and patch norm, the residual conv, the training patch size (``img_size``: from
    the shifted blocks' ``attn_mask`` windows or the position embedding; a window no smaller than it shows as
    missing masks) and the upsampler with its scale."""
    cin, dim = s.dim("conv_first.weight", 1), s.dim("conv_first.weight", 0)
    stages = s.indices("layers.")
    if not stages:
        raise NotThisFamily("no residual groups at layers.")
    depths = [s.count(f"layers.{i}.residual_group.blocks.") for i in stages]
    found = [window(f"layers.{i}.residual_group.blocks.0.") for i in stages]
    first = "layers.0.residual_group.blocks.0."
    ws = max(w for w, _ in found)
    p: dict = {"in_chans": cin, "embed_dim": dim, "depths": depths, "num_heads": [h for _, h in found],
               "window_size": ws, "mlp_ratio": width_ratio(s.dim(f"{first}mlp.fc1.weight", 0), dim, 4.0),
               "qkv_bias": f"{first}attn.{bias_key}" in s, "ape": "absolute_pos_embed" in s,
               "patch_norm": "patch_embed.norm.weight" in s,
               "resi_connection": "3conv" if "conv_after_body.0.weight" in s else "1conv"}
    mask = "layers.0.residual_group.blocks.1.attn_mask"
    if mask in s:
        p["img_size"] = ws * round(s.dim(mask, 0) ** 0.5)
    elif p["ape"]:
        p["img_size"] = round(s.dim("absolute_pos_embed", 1) ** 0.5)
    elif depths[0] > 1:  # shifted blocks without a mask: the window shrank to the patch
        p["img_size"] = ws
    feat = s.dim("conv_before_upsample.0.weight", 0) if "conv_before_upsample.0.weight" in s else 0
    # a BasicSR Upsample after conv_before_upsample (none at x1)
    scale = upsample_scale(s, "upsample.", feat) if feat and s.has_prefix("upsample.") else 1
    if "conv_aux.weight" in s:
        heads = [("pixelshuffle_aux", scale)]
    elif "conv_up1.weight" in s:
        heads = [("nearest+conv", 4)]
    elif feat:
        heads = [("pixelshuffle", scale)]
    elif "upsample.0.weight" in s:
        heads = [("pixelshuffledirect", sc) for _, sc in shuffle_splits(s.dim("upsample.0.weight", 0), (cin,))]
    else:
        heads = [("", 1)]
    return [{**p, "upsampler": up, "upscale": sc} for up, sc in heads]


def _window_and_heads(block: str, s: StateShapes) -> tuple[int, int]:
    table = s.shape(f"{block}attn.relative_position_bias_table")  # ((2 * window - 1) ** 2, heads)
    return (round(table[0] ** 0.5) + 1) // 2, table[1]


def _recognise(s: StateShapes) -> list[dict]:
    """SwinIR from its tensors (``swin_sr_arguments``; the window from the relative-position tables)."""
    s.shape("layers.0.residual_group.blocks.0.attn.qkv.weight")
    return swin_sr_arguments(s, lambda block: _window_and_heads(block, s), "qkv.bias")


register_recogniser("SwinIR", _recognise)
