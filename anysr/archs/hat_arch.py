"""HAT: Hybrid Attention Transformer for image super-resolution (Chen et al., CVPR 2023).

One class covers HAT-S, HAT and HAT-L (they differ only in arguments). Constructor arguments, module names
and buffers follow the authors' code (XPixelGroup/HAT), so their released ``.pth`` files load with
``strict=True`` and give their outputs.

Each residual hybrid attention group (RHAG) runs hybrid attention blocks (HAB: shifted-window self
attention plus a small channel-attention conv branch) and one overlapping cross-attention block (OCAB:
queries from each window, keys/values from a larger window around it), then a conv and a shortcut.

Differences from the authors' code, none of which changes the output of a valid configuration:

* ``forward`` takes any height/width: it pads the input to a multiple of ``window_size`` (reflect, as
  their ``HATModel`` does around the network; replicate beyond what reflect can reach) and crops;
* ``upsampler`` must be 'pixelshuffle' (their code silently returns the input for anything else) and
  ``resi_connection`` '1conv' or 'identity'; values their code cannot run are refused when building.

``HAT_iLN`` (traiNNer-redux's i-LN variant) is the same network built with ``ImageLayerNorm`` as the blocks'
norm (each residual branch rescaled by the norm's scale), affine transforms as the patch and final norms and no
mean shift. Its state dict has HAT's names and shapes exactly, so its files cannot be told from HAT's by them.
"""

from __future__ import annotations

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
    Mlp,
    ShiftedWindowStage,
    SwinSRBase,
    WindowAttention,
    WindowBlockBase,
    check_swin_sr_args,
    drop_path_rates,
    pre_norm,
    relative_position_index,
    rescaled,
    residual_conv,
    shifted_window_mask,
    to_2tuple,
    to_feature_map,
    to_tokens,
    window_attention,
    window_partition,
    window_reverse,
)
from anysr.archs.rcan_arch import ChannelAttention
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


def overlap_position_index(window_size: int, overlap_size: int) -> torch.Tensor:
    """(ws*ws, ows*ows) bias-table index of the overlapping cross attention, as the authors compute it.

    Their offset makes part of the index negative; indexing wraps it around the
    ``(ws + ows - 1)**2``-row table, and the buffer keeps their values so that their checkpoints match.
    """
    q = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                   indexing="ij")).flatten(1)
    kv = torch.stack(torch.meshgrid(torch.arange(overlap_size), torch.arange(overlap_size),
                                    indexing="ij")).flatten(1)
    rel = kv[:, None, :] - q[:, :, None] + (window_size - overlap_size + 1)
    return rel[0] * (window_size + overlap_size - 1) + rel[1]


def overlapping_windows(x: torch.Tensor, window_size: int, margin: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * h/ws * w/ws, (ws + 2*margin)**2, c): each window enlarged by ``margin`` on every
    side (zeros beyond the map), windows in row-major order, like ``nn.Unfold(ws + 2*margin, stride=ws,
    padding=margin)``. Built from slices of the neighbouring windows (``margin <= window_size``), so it
    lowers to plain slices and concatenations on every backend.
    """
    b, h, w, c = x.shape
    ws, m = window_size, margin
    grid = F.pad(x, (0, 0, ws, ws, ws, ws)).view(b, h // ws + 2, ws, w // ws + 2, ws, c)
    rows = torch.cat([grid[:, :-2, ws - m:], grid[:, 1:-1], grid[:, 2:, :m]], dim=2)
    both = torch.cat([rows[:, :, :, :-2, ws - m:], rows[:, :, :, 1:-1], rows[:, :, :, 2:, :m]], dim=4)
    size = ws + 2 * m
    return both.permute(0, 1, 3, 2, 4, 5).reshape(-1, size * size, c)


class CAB(nn.Module):
    """Channel attention block: 3x3 conv (to dim / compress_ratio), GELU, 3x3 conv back, channel attention."""

    def __init__(self, num_feat: int, compress_ratio: int = 3, squeeze_factor: int = 30) -> None:
        super().__init__()
        self.cab = nn.Sequential(
            nn.Conv2d(num_feat, num_feat // compress_ratio, 3, 1, 1),
            nn.GELU(),
            nn.Conv2d(num_feat // compress_ratio, num_feat, 3, 1, 1),
            ChannelAttention(num_feat, squeeze_factor),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cab(x)


class HAB(WindowBlockBase):
    """Hybrid attention block: (shifted-)window attention + ``conv_scale`` * CAB, then an MLP; pre-normed. With
    ``ImageLayerNorm`` (HAT_iLN) both branches together, and the MLP, are multiplied by their norm's scale."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, compress_ratio: int = 3, squeeze_factor: int = 30, conv_scale: float = 0.01,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        # A training patch no larger than the window gives one window: no shift (as the authors do).
        self.init_block_attrs(dim, input_resolution, num_heads, window_size,
                              0 if min(input_resolution) <= window_size else shift_size, mlp_ratio)
        self.conv_scale = conv_scale
        self.norm1 = norm_layer(dim)
        self.attn = WindowAttention(dim, to_2tuple(window_size), num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                    attn_drop=attn_drop, proj_drop=drop, position_index=False)
        self.conv_block = CAB(dim, compress_ratio, squeeze_factor)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi_sa: torch.Tensor,
                attn_mask: torch.Tensor | None) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, shift = self.window_size, self.shift_size
        shortcut = x
        x, scale = pre_norm(self.norm1, x)
        x = x.view(b, h, w, c)
        conv_x = self.conv_block(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = window_partition(x, ws).view(-1, ws * ws, c)
        windows = self.attn(windows, mask=attn_mask if shift else None, rpi=rpi_sa)
        x = window_reverse(windows.view(-1, ws, ws, c), ws, h, w)
        if shift:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        if scale is None:
            x = shortcut + self.drop_path(x.reshape(b, h * w, c)) + conv_x * self.conv_scale
        else:
            x = shortcut + scale * (self.drop_path(x.reshape(b, h * w, c)) + conv_x * self.conv_scale)
        normed, scale = pre_norm(self.norm2, x)
        return x + rescaled(self.drop_path(self.mlp(normed)), scale)


class OCAB(nn.Module):
    """Overlapping cross attention: each window's queries attend to keys/values of an enlarged window
    (``window_size * (1 + overlap_ratio)``, zero-padded at the borders) around it; then an MLP."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], window_size: int, overlap_ratio: float,
                 num_heads: int, qkv_bias: bool = True, qk_scale: float | None = None, mlp_ratio: float = 2.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.window_size = window_size
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.overlap_win_size = int(window_size * overlap_ratio) + window_size
        self.norm1 = norm_layer(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((window_size + self.overlap_win_size - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi: torch.Tensor) -> torch.Tensor:
        h, w = x_size
        b, _, c = x.shape
        ws, ows, heads = self.window_size, self.overlap_win_size, self.num_heads
        shortcut = x
        normed, scale = pre_norm(self.norm1, x)
        qkv = self.qkv(normed).view(b, h, w, 3 * c)
        q = window_partition(qkv[..., :c], ws).reshape(-1, ws * ws, heads, c // heads).transpose(1, 2)
        kv = overlapping_windows(qkv[..., c:], ws, (ows - ws) // 2)  # (b*nw, ows*ows, 2c)
        kv = kv.reshape(kv.shape[0], ows * ows, 2, heads, c // heads).permute(2, 0, 3, 1, 4)  # (2, b*nw, heads, n, d)
        index = rpi.reshape(-1).remainder(self.relative_position_bias_table.shape[0])
        bias = self.relative_position_bias_table[index].view(ws * ws, ows * ows, -1).permute(2, 0, 1)
        out = window_attention(q, kv[0], kv[1], bias, scale=self.scale)
        out = window_reverse(out.transpose(1, 2).reshape(-1, ws, ws, c), ws, h, w).reshape(b, h * w, c)
        x = rescaled(self.proj(out), scale) + shortcut
        normed, scale = pre_norm(self.norm2, x)
        return x + rescaled(self.mlp(normed), scale)


class AttenBlocks(ShiftedWindowStage):
    """``depth`` hybrid attention blocks (alternately plain and shifted windows) and one OCAB."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 compress_ratio: int, squeeze_factor: int, conv_scale: float, overlap_ratio: float,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False) -> None:
        super().__init__()
        self.init_blocks(dim, input_resolution, depth, window_size, drop_path, use_checkpoint,
                         lambda shift, rate: HAB(
                             dim, input_resolution, num_heads, window_size=window_size, shift_size=shift,
                             compress_ratio=compress_ratio, squeeze_factor=squeeze_factor, conv_scale=conv_scale,
                             mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                             attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer))
        self.overlap_attn = OCAB(dim, input_resolution, window_size, overlap_ratio, num_heads, qkv_bias=qkv_bias,
                                 qk_scale=qk_scale, mlp_ratio=mlp_ratio, norm_layer=norm_layer)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], params: dict[str, torch.Tensor | None]
                ) -> torch.Tensor:
        x = self.run_blocks(x, x_size, params["rpi_sa"], params["attn_mask"])
        return self.overlap_attn(x, x_size, params["rpi_oca"])


class RHAG(nn.Module):
    """Residual hybrid attention group: AttenBlocks, a conv on the feature map ('1conv' / 'identity'), shortcut."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 compress_ratio: int, squeeze_factor: int, conv_scale: float, overlap_ratio: float,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float | Sequence[float] = 0.0,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_checkpoint: bool = False,
                 resi_connection: str = "1conv") -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.residual_group = AttenBlocks(dim, input_resolution, depth, num_heads, window_size, compress_ratio,
                                          squeeze_factor, conv_scale, overlap_ratio, mlp_ratio=mlp_ratio,
                                          qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                                          drop_path=drop_path, norm_layer=norm_layer, use_checkpoint=use_checkpoint)
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], params: dict[str, torch.Tensor | None]
                ) -> torch.Tensor:
        return to_tokens(self.conv(to_feature_map(self.residual_group(x, x_size, params), *x_size))) + x


@ARCH_REGISTRY.register()
class HAT(SwinSRBase):
    """Hybrid Attention Transformer (HAT-S / HAT / HAT-L by arguments), for classical SR x2/x3/x4.

    Args (the authors' names; defaults theirs except ``upsampler`` and ``window_size``, whose defaults cannot
    run there: '' skips the reconstruction, 7 gives odd overlaps): img_size (training patch size: decides
    whether blocks shift and the ``absolute_pos_embed`` size), patch_size, in_chans, embed_dim, depths,
    num_heads (one per group), window_size, compress_ratio and squeeze_factor (of the conv branch),
    conv_scale (its weight), overlap_ratio (OCAB window enlargement), mlp_ratio, qkv_bias, qk_scale,
    drop_rate, attn_drop_rate, drop_path_rate, norm_layer, ape, patch_norm, use_checkpoint (recompute each
    block in backward), upscale (1, 2**n or 3), img_range, upsampler ('pixelshuffle'), resi_connection
    ('1conv' or 'identity'), rgb_mean (RGB input mean, by default DIV2K's; neosr's: 0.5 each), num_feat (the
    pixel-shuffle reconstruction's width; spandrel's argument, 64 in the published models).

    HAT-S: embed_dim 144, depths/num_heads 6 x 6, window 16, compress_ratio 24, squeeze_factor 24, mlp_ratio 2.
    HAT: embed_dim 180, the same but compress_ratio 3, squeeze_factor 30. HAT-L: HAT with 12 groups.
    """

    affine_ends: ClassVar[bool] = False  # HAT_iLN: affine transforms as the patch and final norms

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 96, depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 16, compress_ratio: int = 3, squeeze_factor: int = 30, conv_scale: float = 0.01,
                 overlap_ratio: float = 0.5, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2, img_range: float = 1.0,
                 upsampler: str = "pixelshuffle", resi_connection: str = "1conv",
                 rgb_mean: Sequence[float] | None = None, num_feat: int = 64) -> None:
        super().__init__()
        _check_hat_args(img_size, patch_size, embed_dim, depths, num_heads, window_size, compress_ratio,
                        squeeze_factor, overlap_ratio, upscale, upsampler, resi_connection)
        self.window_size = window_size
        self.shift_size = window_size // 2
        self.overlap_ratio = overlap_ratio
        self.tile_multiple: int = window_size
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler, rgb_mean)
        self.register_buffer("relative_position_index_SA", relative_position_index(window_size))
        overlap = int(overlap_ratio * window_size) + window_size
        self.register_buffer("relative_position_index_OCA", overlap_position_index(window_size, overlap))
        self.mlp_ratio = mlp_ratio
        end_norm = AffineTransform if self.affine_ends else norm_layer
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, end_norm, patch_norm, ape, drop_rate)

        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RHAG(embed_dim, resolution, depth, num_heads[i], window_size, compress_ratio,
                                    squeeze_factor, conv_scale, overlap_ratio, mlp_ratio=mlp_ratio,
                                    qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate,
                                    attn_drop=attn_drop_rate, drop_path=rates[start:start + depth],
                                    norm_layer=norm_layer, use_checkpoint=use_checkpoint,
                                    resi_connection=resi_connection))
        self.norm = end_norm(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale, num_feat=num_feat)
        self.init_swin_weights()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The attention body on a (b, embed_dim, h, w) map whose sides are multiples of ``window_size``."""
        x_size = (x.shape[2], x.shape[3])
        params: dict[str, torch.Tensor | None] = {
            "attn_mask": shifted_window_mask(x_size[0], x_size[1], self.window_size, self.shift_size,
                                             x.device, x.dtype) if self.shift_size else None,
            "rpi_sa": self.relative_position_index_SA,
            "rpi_oca": self.relative_position_index_OCA,
        }
        x = self.embed_tokens(x)
        for layer in self.layers:
            x = layer(x, x_size, params)
        return to_feature_map(self.norm(x), *x_size)


@ARCH_REGISTRY.register()
class HAT_iLN(HAT):  # noqa: N801 - traiNNer-redux's class name
    """HAT with i-LN (traiNNer-redux's ``HAT_iLN``; Lee et al. 2025, arXiv 2504.06629): ``ImageLayerNorm`` before
    each block's attention and MLP (the branches rescaled by its scale), ``AffineTransform`` as the patch-embedding
    and final norms, and no mean shift / ``img_range``. Otherwise HAT: the same blocks, arguments (but
    ``img_range``) and state-dict names and shapes.
    """

    swin_init_norms = (nn.LayerNorm, ImageLayerNorm)
    affine_ends = True

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 96, depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 16, compress_ratio: int = 3, squeeze_factor: int = 30, conv_scale: float = 0.01,
                 overlap_ratio: float = 0.5, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = ImageLayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2,
                 upsampler: str = "pixelshuffle", resi_connection: str = "1conv") -> None:
        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                         depths=depths, num_heads=num_heads, window_size=window_size, compress_ratio=compress_ratio,
                         squeeze_factor=squeeze_factor, conv_scale=conv_scale, overlap_ratio=overlap_ratio,
                         mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate,
                         attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate, norm_layer=norm_layer, ape=ape,
                         patch_norm=patch_norm, use_checkpoint=use_checkpoint, upscale=upscale, img_range=1.0,
                         upsampler=upsampler, resi_connection=resi_connection)
        self.register_buffer("mean", torch.zeros(1, 1, 1, 1), persistent=False)  # no mean shift


def _check_hat_args(img_size: int | Sequence[int], patch_size: int | Sequence[int], embed_dim: int,
                    depths: Sequence[int], num_heads: Sequence[int], window_size: int, compress_ratio: int,
                    squeeze_factor: int, overlap_ratio: float, upscale: int, upsampler: str,
                    resi_connection: str) -> None:
    """Refuse arguments the authors' HAT cannot run (it fails later, or silently skips reconstruction)."""
    check_swin_sr_args("HAT", depths, num_heads, window_size, upscale, upsampler, resi_connection)
    for heads in num_heads:
        if embed_dim % heads:
            raise ArchArgumentError("num_heads", f"HAT: embed_dim {embed_dim} is not divisible by {heads} heads")
    img, patch = to_2tuple(img_size), to_2tuple(patch_size)
    if min(img[0] // patch[0], img[1] // patch[1]) < window_size:
        raise ArchArgumentError("img_size", f"HAT: img_size {img_size} (in patches) must be at least window_size "
                                f"{window_size}; the original builds mismatched position tables otherwise")
    if not 0 <= overlap_ratio <= 2:
        raise ArchArgumentError("overlap_ratio", f"HAT: overlap_ratio must be in [0, 2], got {overlap_ratio!r}")
    if (int(window_size * overlap_ratio)) % 2:
        raise ArchArgumentError("overlap_ratio", f"HAT: int(window_size * overlap_ratio) = "
                                f"{int(window_size * overlap_ratio)} must be even so that the enlarged windows "
                                "stay centred (one per window)")
    for name, factor in (("compress_ratio", compress_ratio), ("squeeze_factor", squeeze_factor)):
        if not isinstance(factor, int) or factor < 1 or embed_dim // factor < 1:
            raise ArchArgumentError(name, f"HAT: {name} must be an integer in [1, embed_dim={embed_dim}], "
                                    f"got {factor!r}")


__all__ = ["HAB", "HAT", "HAT_iLN", "OCAB", "RHAG", "overlap_position_index", "overlapping_windows"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
PRESETS: dict[str, dict] = {
    # 40.85 M parameters at x4
    "hat_l": {"upscale": 4, "embed_dim": 180, "depths": (6,) * 12, "num_heads": (6,) * 12, "mlp_ratio": 2.0},
    # 46.33 M parameters at x4
    "hat_l_aligned": {"upscale": 4, "embed_dim": 192, "depths": (6,) * 12, "num_heads": (6,) * 12, "mlp_ratio": 2.0},
    # 20.77 M parameters at x4
    "hat_m": {"upscale": 4, "embed_dim": 180, "depths": (6,) * 6, "num_heads": (6,) * 6, "mlp_ratio": 2.0},
    # 23.54 M parameters at x4
    "hat_m_aligned": {"upscale": 4, "embed_dim": 192, "depths": (6,) * 6, "num_heads": (6,) * 6, "mlp_ratio": 2.0},
    # 9.62 M parameters at x4
    "hat_s": {
        "upscale": 4, "embed_dim": 144, "depths": (6,) * 6, "num_heads": (6,) * 6, "compress_ratio": 24,
        "squeeze_factor": 24, "mlp_ratio": 2.0
    },
}
register_presets("HAT", PRESETS, scale_arg="upscale")
# traiNNer-redux's i-LN builders: HAT's sizes (the same parameter counts).
register_presets("HAT_iLN", {name.replace("hat", "hat_iln", 1): kwargs for name, kwargs in PRESETS.items()},
                 scale_arg="upscale", fixed={"num_feat": 64})


def _recognise(s: StateShapes) -> list[dict]:
    """HAT from its tensors: width and channels from the first conv, blocks per group, heads from each group's
    bias tables, the window from the self-attention index buffer, the overlap ratio from the overlapping
    cross-attention's table, the CAB's compression and squeeze from its convs (the published 3 / 24 and 30 / 24
    when they give those widths), the MLP ratio, switches, the reconstruction. ``img_size`` shows only with
    ``ape`` (the position embedding's length)."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    groups = s.indices("layers.")
    window = window_from_index(s, "relative_position_index_SA")
    overlap = square_side(s.dim("relative_position_index_OCA", 1), "relative_position_index_OCA")
    block = "layers.0.residual_group.blocks.0"
    cab = s.dim(f"{block}.conv_block.cab.0.weight", 0)
    squeezed = s.dim(f"{block}.conv_block.cab.3.attention.1.weight", 0)
    compress = next((c for c in (3, 24) if embed // c == cab), embed // cab)
    squeeze = next((q for q in (30, 24) if embed // q == squeezed), embed // squeezed)
    ape = "absolute_pos_embed" in s
    common = {"in_chans": cin, "embed_dim": embed,
              "depths": [s.count(f"layers.{i}.residual_group.blocks.") for i in groups],
              "num_heads": [s.dim(f"layers.{i}.residual_group.blocks.0.attn.relative_position_bias_table", 1)
                            for i in groups],
              "window_size": window, "compress_ratio": compress, "squeeze_factor": squeeze,
              "overlap_ratio": clean((overlap - window) / window),
              "mlp_ratio": clean(s.dim(f"{block}.mlp.fc1.weight", 0) / embed),
              "qkv_bias": f"{block}.attn.qkv.bias" in s, "ape": ape, "patch_norm": "patch_embed.norm.weight" in s,
              "resi_connection": resi_connection(s, "conv_after_body")}
    if ape:
        common["img_size"] = square_side(s.dim("absolute_pos_embed", 1), "absolute_pos_embed")
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"],
             **({"num_feat": r["feat"]} if r.get("feat", 64) != 64 else {})}  # 64: the published width
            for r in reconstruction(s, cin) if r["out"] == cin]


register_recogniser("HAT", _recognise)
