"""DWT: image super-resolution with a dilated window transformer (SwinIR's layout, traiNNer-redux's ``DWT``).

Module names, buffers and constructor arguments follow traiNNer-redux's ``DWT`` (builders ``dwt``, ``dwt_s``), so
its checkpoints load with ``strict=True`` and give its outputs. Each residual group runs window attention blocks
whose kind is set per block by ``layer_kinds``:

* ``0``: attention inside plain windows;
* ``-1``: shifted windows (the odd blocks roll by half a window; masked as SwinIR);
* ``g > 0``: dilated windows: the map is cut into ``g x g`` blocks and each window gathers, inside one block, every
  ``(side / g / window)``-th pixel (odd blocks roll first). The reference masks these windows with the mask of the
  plain windows of each block (not of the gathered pixels); that is kept, so its weights give its outputs.

Differences from traiNNer-redux's class, none of which changes the output of a configuration it runs:

* the defaults are those of its ``dwt`` builder (the class's own, window 7 on a 64-pixel patch and no upsampler,
  cannot run there); ``upsampler`` must be 'pixelshuffle' (its forward returns the input for the others);
* inputs are padded (reflect, then replicate beyond what reflect reaches) to a multiple of ``tile_multiple``:
  twice the window as the reference, or more when a dilation needs it (where the reference fails);
* masks are computed for the input's size on its device; the ``attn_mask`` buffers (made for ``img_size``, rounded
  up to what the block's partition needs) are kept for the reference's state-dict keys only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

import anysr.archs.swinir_arch  # noqa: F401 - SwinIR's recogniser first: it reads the layouts both have
from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    Mlp,
    ShiftedWindowStage,
    SwinSRBase,
    WindowAttention,
    WindowBlockBase,
    check_upscale,
    drop_path_rates,
    residual_conv,
    shifted_window_mask,
    to_2tuple,
    to_feature_map,
    to_tokens,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser, width_ratio
from anysr.archs.recognition.recognise_util import reconstruction, resi_connection, square_side, window_from_table
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

# traiNNer-redux's layout: per residual group, the kind of each block
PUBLISHED_LAYER_KINDS = ((0, -1) * 3, (0, -1) * 3, (0, 2) * 3, (0, 2) * 3, (0, 1) * 3, (0, 1) * 3)


def dilated_window_partition(x: torch.Tensor, window_size: int, partitions: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * h/ws * w/ws, ws, ws, c): the map cut into ``partitions x partitions`` blocks, each block
    into windows of every ``d``-th pixel (``d = side / partitions / ws``); windows ordered (image, block row, block
    column, offset row, offset column), one reshape and one permute."""
    b, h, w, c = x.shape
    g, ws = partitions, window_size
    dh, dw = h // (g * ws), w // (g * ws)
    x = x.view(b, g, ws, dh, g, ws, dw, c)
    return x.permute(0, 1, 4, 3, 6, 2, 5, 7).reshape(-1, ws, ws, c)


def dilated_window_reverse(windows: torch.Tensor, window_size: int, h: int, w: int, partitions: int
                           ) -> torch.Tensor:
    """Inverse of ``dilated_window_partition``: (b * nw, ws, ws, c) -> (b, h, w, c)."""
    g, ws = partitions, window_size
    dh, dw = h // (g * ws), w // (g * ws)
    x = windows.view(-1, g, g, dh, dw, ws, ws, windows.shape[-1])
    return x.permute(0, 1, 5, 3, 2, 6, 4, 7).reshape(-1, h, w, windows.shape[-1])


def dwt_mask(h: int, w: int, window_size: int, shift_size: int, kind: int, device: torch.device | None = None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The additive mask (windows, ws*ws, ws*ws) of 0 / -100 of a block of ``kind`` on an ``h x w`` map, None where
    the reference's is all zeros (plain windows, no shift). A dilated block gets the shifted-window mask of the
    plain windows of each of its blocks (the reference's), in its windows' order."""
    if kind == 0 or shift_size == 0:
        return None
    mask = shifted_window_mask(h, w, window_size, shift_size, device, dtype)
    if kind < 2:
        return mask
    n = mask.shape[-1]
    nh, nw = h // window_size, w // window_size
    return mask.view(kind, nh // kind, kind, nw // kind, n, n).permute(0, 2, 1, 3, 4, 5).reshape(-1, n, n)


class DWTBlock(WindowBlockBase):
    """Window attention (plain, shifted or dilated: ``layer_kind``) + MLP, each pre-normed with a residual.

    If ``input_resolution`` is not larger than ``window_size``, the window shrinks to it and the shift is dropped
    (as the reference; this decides the parameter shapes)."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm,
                 layer_kind: int = 0) -> None:
        super().__init__()
        self.init_block_attrs(dim, input_resolution, num_heads, window_size, shift_size, mlp_ratio)
        self.layer_kind = layer_kind
        if min(input_resolution) <= window_size:
            self.shift_size = 0
            self.window_size = min(input_resolution)
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, to_2tuple(self.window_size), num_heads, qkv_bias=qkv_bias,
                                    qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        mask = None
        if layer_kind != 0:  # the reference's buffer (zeros without a shift), for img_size rounded up
            ws, step = self.window_size, self.window_size * max(layer_kind, 1)
            h, w = (math.ceil(n / step) * step for n in input_resolution)
            mask = dwt_mask(h, w, ws, self.shift_size, layer_kind)
            if mask is None:
                mask = torch.zeros(h * w // ws**2, ws * ws, ws * ws)
        self.register_buffer("attn_mask", mask)

    @property
    def partition_multiple(self) -> int:
        """What the map's sides must be a multiple of for this block's windows."""
        return self.window_size * max(self.layer_kind, 1)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], masks: dict[int, torch.Tensor | None]
                ) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift, kind = self.window_size, self.shift_size, self.layer_kind
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        rolled = kind != 0 and shift > 0
        if rolled:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = dilated_window_partition(x, ws, kind) if kind > 0 else window_partition(x, ws)
        windows = self.attn(windows.view(-1, ws * ws, c), mask=masks.get(kind) if rolled else None)
        windows = windows.view(-1, ws, ws, c)
        x = dilated_window_reverse(windows, ws, h, w, kind) if kind > 0 else window_reverse(windows, ws, h, w)
        if rolled:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        x = shortcut + self.drop_path(x.reshape(b, h * w, c))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class AttentionBlock(ShiftedWindowStage):
    """``depth`` DWT blocks (shifted by half a window every second block), of the kinds ``layer_kind``."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 layer_kind: Sequence[int] = (0, -1, 0, -1, 0, -1)) -> None:
        super().__init__()
        kinds = iter(layer_kind)  # blocks are made in order
        self.init_blocks(dim, input_resolution, depth, window_size, drop_path, use_checkpoint,
                         lambda shift, rate: DWTBlock(
                             dim, input_resolution, num_heads, window_size=window_size, shift_size=shift,
                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                             attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer, layer_kind=next(kinds)))
        self.downsample = None

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], masks: dict[int, torch.Tensor | None]
                ) -> torch.Tensor:
        return self.run_blocks(x, x_size, masks)


class RTG(nn.Module):
    """Residual transformer group: an AttentionBlock, a conv on the feature map ('1conv' / '3conv'), a shortcut."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 resi_connection: str = "1conv", layer_kind: Sequence[int] = (0, -1, 0, -1, 0, -1)) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = AttentionBlock(dim, input_resolution, depth, num_heads, window_size,
                                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                                             attn_drop=attn_drop, drop_path=drop_path, norm_layer=norm_layer,
                                             use_checkpoint=use_checkpoint, layer_kind=layer_kind)
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], masks: dict[int, torch.Tensor | None]
                ) -> torch.Tensor:
        return to_tokens(self.conv(to_feature_map(self.residual_group(x, x_size, masks), *x_size))) + x


@ARCH_REGISTRY.register()
class DWT(SwinSRBase):
    """Dilated Window Transformer ("Image Super-Resolution Using Dilated Window Transformer"), for SR at x1, 2**n, 3.

    Args (traiNNer-redux's names; defaults of its ``dwt`` builder): img_size (training patch: the ``attn_mask``
    buffers' size; a window no smaller than it shrinks to it, unshifted), patch_size, in_chans, embed_dim, depths,
    num_heads (one per group), window_size, mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate,
    drop_path_rate, norm_layer, ape (absolute position embedding: inputs of ``img_size`` only), patch_norm,
    use_checkpoint (recompute each block in backward), upscale, img_range, upsampler ('pixelshuffle'),
    resi_connection ('1conv' or '3conv'), layer_kinds (per group, per block: 0 plain, -1 shifted, g > 0 dilated
    over ``g x g`` blocks; default the published six groups: shifted, shifted, 2, 2, 1, 1 in every second block).
    """

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 180, depths: Sequence[int] = (6,) * 6, num_heads: Sequence[int] = (6,) * 6,
                 window_size: int = 16, mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 4, img_range: float = 1.0,
                 upsampler: str = "pixelshuffle", resi_connection: str = "1conv",
                 layer_kinds: Sequence[Sequence[int]] | None = None) -> None:
        super().__init__()
        kinds = [list(k) for k in (PUBLISHED_LAYER_KINDS if layer_kinds is None else layer_kinds)]
        _check_dwt_args(embed_dim, depths, num_heads, window_size, upscale, upsampler, resi_connection, kinds)
        self.window_size = window_size
        self.layer_kinds = kinds
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler)
        self.mlp_ratio = mlp_ratio
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, norm_layer, patch_norm, ape, drop_rate)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RTG(embed_dim, resolution, depth, num_heads[i], window_size, mlp_ratio=mlp_ratio,
                                   qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                                   drop_path=rates[start:start + depth], norm_layer=norm_layer,
                                   use_checkpoint=use_checkpoint, resi_connection=resi_connection,
                                   layer_kind=kinds[i]))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale)
        self.init_swin_weights()
        blocks = [blk for layer in self.layers for blk in layer.residual_group.blocks]
        # twice the window, as the reference pads; more where a dilation needs it
        self.tile_multiple: int = math.lcm(2 * window_size, *(blk.partition_multiple for blk in blocks))
        self._masked = sorted({blk.layer_kind for blk in blocks if blk.layer_kind != 0 and blk.shift_size})
        self._shift = max((blk.shift_size for blk in blocks), default=0)
        self._window = blocks[0].window_size if blocks else window_size

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The attention body on a (b, embed_dim, h, w) map whose sides are multiples of ``tile_multiple``."""
        h, w = x.shape[2], x.shape[3]
        masks = {k: dwt_mask(h, w, self._window, self._shift, k, x.device, x.dtype) for k in self._masked}
        x = self.embed_tokens(x)
        for layer in self.layers:
            x = layer(x, (h, w), masks)
        return to_feature_map(self.norm(x), h, w)


def _check_dwt_args(embed_dim: int, depths: Sequence[int], num_heads: Sequence[int], window_size: int,
                    upscale: int, upsampler: str, resi_connection: str, kinds: list[list[int]]) -> None:
    """Refuse what traiNNer-redux's DWT cannot run (it fails later, or returns its input)."""
    if upsampler != "pixelshuffle":
        raise ArchArgumentError("upsampler", f"DWT: upsampler must be 'pixelshuffle', got {upsampler!r} (the "
                                "reference's forward reconstructs with no other)")
    if resi_connection not in ("1conv", "3conv"):
        raise ArchArgumentError("resi_connection", f"DWT: unknown resi_connection {resi_connection!r}; use '1conv' "
                                "or '3conv'")
    check_upscale(upscale)
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ArchArgumentError("window_size", f"DWT: window_size must be a positive integer, got {window_size!r}")
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"DWT: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per group")
    for heads in num_heads:
        if embed_dim % heads:
            raise ArchArgumentError("num_heads", f"DWT: embed_dim {embed_dim} is not divisible by {heads} heads")
    if len(kinds) < len(depths) or any(len(k) < d for k, d in zip(kinds, depths, strict=False)):
        raise ArchArgumentError("layer_kinds", f"DWT: layer_kinds needs one list per group with one kind per block "
                                f"(depths {list(depths)}), got {kinds}")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < -1 for ks in kinds for k in ks):
        raise ArchArgumentError("layer_kinds", f"DWT: a layer kind is 0 (plain), -1 (shifted) or a partition count "
                                f"> 0 (dilated), got {kinds}")


__all__ = ["DWT", "DWTBlock", "RTG", "dilated_window_partition", "dilated_window_reverse", "dwt_mask"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("DWT", scale_arg="upscale", presets={
    "dwt": {},  # 12.06 M parameters at x4
    "dwt_s": {"window_size": 8},  # 11.90 M at x4
})


def _published_kind(group: int, groups: int) -> int:
    """The kind of a masked block: the published layout's (shifted, then dilated by 2, then by 1: thirds)."""
    return (-1, 2, 1)[min(3 * group // groups, 2)]


def _recognise(s: StateShapes) -> list[dict]:
    """DWT from its tensors: width and channels from the first conv, blocks per group, heads and window from the
    bias tables, which blocks are not plain (their ``attn_mask`` buffers: which of shifted / dilated 2 / dilated 1
    they are is not in the tensors: the published layout's kind of the group), ``img_size`` from a mask's windows,
    the MLP ratio, switches, the residual conv and the reconstruction.

    Masks on every second block alone are SwinIR's layout too (the published layer kinds have them): such a file
    is proposed only at the published sizes (6 x 6 blocks of width 180, 8- or 16-pixel windows, 64-pixel patch),
    after SwinIR (whose recogniser registers first: ``recognise`` reads SwinIR and names DWT as also fitting)."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    groups = s.indices("layers.")
    if not groups:
        raise NotThisFamily("no residual groups at layers.")
    first = "layers.0.residual_group.blocks.0."
    window = window_from_table(s, f"{first}attn.relative_position_bias_table")
    depths = [s.count(f"layers.{i}.residual_group.blocks.") for i in groups]
    masked = [[f"layers.{i}.residual_group.blocks.{j}.attn_mask" in s for j in range(d)]
              for i, d in zip(groups, depths, strict=True)]
    masks = [f"layers.{i}.residual_group.blocks.{j}.attn_mask" for i, row in zip(groups, masked, strict=True)
             for j, m in enumerate(row) if m]
    if not masks:
        raise NotThisFamily("no attn_mask: plain windows only (a SwinIR-like layout)")
    # per side; a dilated block's mask is made for img_size rounded up to its partition: the fewest is the patch's
    windows = min(square_side(s.dim(k, 0), k) for k in masks)
    swinir_like = windows > 1 and all(m == (j % 2 == 1) for row in masked for j, m in enumerate(row))
    if swinir_like and (embed, depths, window * windows, window in (8, 16)) != (180, [6] * 6, 64, True):
        raise NotThisFamily("SwinIR's layout")
    ape = "absolute_pos_embed" in s
    p: dict = {"in_chans": cin, "embed_dim": embed, "depths": depths,
               "num_heads": [s.dim(f"layers.{i}.residual_group.blocks.0.attn.relative_position_bias_table", 1)
                             for i in groups],
               "window_size": window, "mlp_ratio": width_ratio(s.dim(f"{first}mlp.fc1.weight", 0), embed, 2.0),
               "qkv_bias": f"{first}attn.qkv.bias" in s, "ape": ape, "patch_norm": "patch_embed.norm.weight" in s,
               "resi_connection": resi_connection(s, "conv_after_body"),
               "layer_kinds": [[_published_kind(n, len(groups)) if m else 0 for m in row]
                               for n, row in enumerate(masked)],
               "img_size": square_side(s.dim("absolute_pos_embed", 1), "absolute_pos_embed") if ape
               else window * windows}
    return [{**p, "upscale": r["upscale"], "upsampler": "pixelshuffle"}
            for r in reconstruction(s, cin) if r["upsampler"] == "pixelshuffle" and r["out"] == cin]


register_recogniser("DWT", _recognise)
