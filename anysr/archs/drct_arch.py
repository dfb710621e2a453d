"""DRCT: Dense-residual-connected Transformer for image super-resolution (Hsu et al., CVPRW 2024).

One class covers DRCT and DRCT-L (they differ only in arguments). Constructor arguments, module names and
buffers follow the authors' code (ming053l/DRCT), so their released ``.pth`` files load with
``strict=True`` and give their outputs.

Each residual dense group (RDG) chains five Swin blocks densely: block ``i`` sees the group input and the
``gc``-channel outputs of all earlier blocks (concatenated), and a 1x1 conv squeezes its output back to
``gc`` channels (the last one to ``embed_dim``); the group adds 0.2 x that to its input. The Swin blocks
are SwinIR's (``anysr.archs.swinir_arch.SwinTransformerBlock``, the same parameters and buffers).

``forward`` takes any height/width: it pads the input to a multiple of the window (reflect, as the
authors' ``DRCTModel`` does around the network; replicate beyond what reflect can reach) and crops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import (
    ArchArgumentError,
    SwinSRBase,
    check_swin_sr_args,
    drop_path_rates,
    residual_conv,
    run_checkpointed,
    to_feature_map,
    to_tokens,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import (
    clean,
    img_size_from_mask,
    reconstruction,
    resi_connection,
    window_from_index,
)
from anysr.archs.swinir_arch import SwinTransformerBlock
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

NUM_DENSE_BLOCKS = 5


def dense_block_heads(dim: int, gc: int, num_heads: int) -> list[int]:
    """Head counts of the five blocks of an RDG (the authors' rule: block ``i`` works on ``dim + i*gc``
    channels with ``num_heads - (dim + i*gc) % num_heads`` heads)."""
    return [num_heads - (dim + i * gc) % num_heads for i in range(NUM_DENSE_BLOCKS)]


class RDG(nn.Module):
    """Residual dense group: five densely connected Swin blocks (modules ``swin1..5``, ``adjust1..5``)."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], depth: int, num_heads: int, window_size: int,
                 shift_size: int, mlp_ratio: float, qkv_bias: bool, qk_scale: float | None, drop: float,
                 attn_drop: float, drop_path: float | Sequence[float], norm_layer: type[nn.Module], gc: int,
                 patch_size: int | Sequence[int], img_size: int | Sequence[int]) -> None:
        super().__init__()
        del depth, shift_size, patch_size, img_size  # the authors' signature; the dense layout fixes them
        rate = (drop_path[0] if len(drop_path) else 0.0) if isinstance(drop_path, Sequence) else drop_path
        self.dim = dim
        self.gc = gc
        for i, heads in enumerate(dense_block_heads(dim, gc, num_heads)):
            channels = dim + i * gc
            block = SwinTransformerBlock(channels, input_resolution, heads, window_size=window_size,
                                         shift_size=0 if i % 2 == 0 else window_size // 2,
                                         mlp_ratio=mlp_ratio if i < 3 else 1, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                         drop=drop, attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer)
            self.add_module(f"swin{i + 1}", block)
            self.add_module(f"adjust{i + 1}", nn.Conv2d(channels, gc if i < NUM_DENSE_BLOCKS - 1 else dim, 1))
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        feats = [x]
        for i in range(1, NUM_DENSE_BLOCKS + 1):
            y = getattr(self, f"swin{i}")(torch.cat(feats, dim=-1) if i > 1 else x, x_size)
            y = getattr(self, f"adjust{i}")(to_feature_map(y, *x_size))
            if i < NUM_DENSE_BLOCKS:
                y = self.lrelu(y)
            feats.append(to_tokens(y))
        return feats[-1] * 0.2 + x


@ARCH_REGISTRY.register()
class DRCT(SwinSRBase):
    """Dense-residual-connected Transformer (DRCT / DRCT-L by arguments), for classical SR.

    Args (the authors' names; defaults theirs except ``upsampler``): img_size (training patch size: decides
    whether blocks shift, the ``attn_mask`` buffers and the ``absolute_pos_embed`` size), patch_size,
    in_chans, embed_dim, depths (only their count and the drop-path schedule matter: each group has five
    blocks), num_heads (one per group), window_size, mlp_ratio, qkv_bias, qk_scale, drop_rate,
    attn_drop_rate, drop_path_rate, norm_layer, ape, patch_norm, use_checkpoint (recompute each group in
    backward), upscale (1, 2**n or 3), img_range, upsampler ('pixelshuffle'), resi_connection ('1conv' or
    'identity'), gc (growth channels), rgb_mean (RGB input mean, by default DIV2K's; neosr's: 0.5 each).
    compress_ratio, squeeze_factor, conv_scale and overlap_ratio are accepted and unused, as in the authors' code
    (their option files set them).

    DRCT: embed_dim 180, depths/num_heads 6 x 6, window 16, mlp_ratio 2, gc 32. DRCT-L: 12 groups.
    """

    def __init__(self, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1, in_chans: int = 3,
                 embed_dim: int = 96, depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 7, compress_ratio: int = 3, squeeze_factor: int = 30, conv_scale: float = 0.01,
                 overlap_ratio: float = 0.5, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, use_checkpoint: bool = False, upscale: int = 2, img_range: float = 1.0,
                 upsampler: str = "pixelshuffle", resi_connection: str = "1conv", gc: int = 32,
                 rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        del compress_ratio, squeeze_factor, conv_scale  # unused by the authors' DRCT too
        _check_drct_args(embed_dim, depths, num_heads, window_size, gc, upscale, upsampler, resi_connection)
        self.window_size = window_size
        self.shift_size = window_size // 2
        self.overlap_ratio = overlap_ratio
        self.use_checkpoint = use_checkpoint
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler, rgb_mean)
        self.mlp_ratio = mlp_ratio
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, norm_layer, patch_norm, ape, drop_rate)

        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            start = sum(depths[:i])
            self.layers.append(RDG(embed_dim, resolution, 0, num_heads[i], window_size, window_size // 2,
                                   mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate,
                                   rates[start:start + depth], norm_layer, gc, patch_size, img_size))
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale)
        # The window the blocks use shrinks to img_size when that is not larger (as in SwinIR); the input
        # is padded to the configured window (as the authors' model does) and to every block's window.
        windows = {blk.window_size for layer in self.layers for blk in layer.children()
                   if isinstance(blk, SwinTransformerBlock)}
        self.tile_multiple: int = math.lcm(window_size, *windows)
        self.init_swin_weights()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The RDGs on a (b, embed_dim, h, w) map whose sides are multiples of ``tile_multiple``."""
        x_size = (x.shape[2], x.shape[3])
        x = self.embed_tokens(x)
        for layer in self.layers:
            x = run_checkpointed(layer, x, x_size, enabled=self.use_checkpoint)
        return to_feature_map(self.norm(x), *x_size)


def _check_drct_args(embed_dim: int, depths: Sequence[int], num_heads: Sequence[int], window_size: int, gc: int,
                     upscale: int, upsampler: str, resi_connection: str) -> None:
    """Refuse arguments the authors' DRCT cannot run (it fails later, or silently skips reconstruction)."""
    check_swin_sr_args("DRCT", depths, num_heads, window_size, upscale, upsampler, resi_connection)
    for heads in num_heads:
        for i, block_heads in enumerate(dense_block_heads(embed_dim, gc, heads)):
            channels = embed_dim + i * gc
            if channels % block_heads:
                raise ArchArgumentError(
                    "gc", f"DRCT: block {i + 1} of a group has embed_dim + {i}*gc = {channels} channels, not "
                    f"divisible by its {block_heads} heads (num_heads {heads} - {channels} % {heads}); "
                    "choose embed_dim, gc and num_heads that divide")


__all__ = ["DRCT", "RDG", "dense_block_heads"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("DRCT", scale_arg="upscale", presets={
    # 14.14 M parameters at x4
    "drct": {
        "upscale": 4, "window_size": 16, "depths": (6,) * 6, "embed_dim": 180, "num_heads": (6,) * 6,
        "mlp_ratio": 2.0
    },
    # 27.58 M parameters at x4
    "drct_l": {
        "upscale": 4, "window_size": 16, "depths": (6,) * 12, "embed_dim": 180, "num_heads": (6,) * 12,
        "mlp_ratio": 2.0
    },
    # 32.06 M parameters at x4
    "drct_xl": {
        "upscale": 4, "window_size": 16, "depths": (6,) * 14, "embed_dim": 180, "num_heads": (6,) * 14,
        "mlp_ratio": 2.0
    },
})

# neosr's name (tests/test_neosr_names.py checks it against the network neosr builds)
register_presets("DRCT", scale_arg="upscale", source="neosr", presets={
    # 2.46 M parameters at x4
    "drct_s": {"window_size": 16, "depths": (2,) * 4, "embed_dim": 48, "num_heads": (6,) * 4, "mlp_ratio": 2.0,
               "rgb_mean": (0.5,) * 3},
})


def _recognise(s: StateShapes) -> list[dict]:
    """DRCT from its tensors: width and channels from the first conv, one group per ``layers`` entry (the dense
    layout fixes each group's blocks: the published depth 6 is kept), the head count that gives each group's five
    blocks their tables' heads, the (effective) window from the index buffers, ``img_size`` from the shifted
    blocks' masks, the growth channels, MLP ratio, switches, the reconstruction."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    gc = s.dim("layers.0.adjust1.weight", 0)
    groups = s.indices("layers.")
    heads = []
    for i in groups:
        seen = [s.dim(f"layers.{i}.swin{k}.attn.relative_position_bias_table", 1) for k in range(1, 6)]
        head = next((h for h in range(1, max(seen) + 2) if dense_block_heads(embed, gc, h) == seen), None)
        if head is None:
            return []
        heads.append(head)
    window = window_from_index(s, "layers.0.swin1.attn.relative_position_index")
    img_size = img_size_from_mask(s, "layers.0.swin2.attn_mask", window) if "layers.0.swin2.attn_mask" in s \
        else window  # no shifted block: the image is no larger than the window
    common = {"img_size": img_size, "in_chans": cin, "embed_dim": embed, "depths": [6] * len(groups),
              "num_heads": heads, "window_size": window,
              "mlp_ratio": clean(s.dim("layers.0.swin1.mlp.fc1.weight", 0) / embed),
              "qkv_bias": "layers.0.swin1.attn.qkv.bias" in s, "ape": "absolute_pos_embed" in s,
              "patch_norm": "patch_embed.norm.weight" in s, "resi_connection": resi_connection(s, "conv_after_body"),
              "gc": gc}
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"]}
            for r in reconstruction(s, cin) if r["out"] == cin]


register_recogniser("DRCT", _recognise)
