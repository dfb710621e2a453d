"""SRFormerV2 (traiNNer-redux's ``srformerv2``): SRFormer's permuted self-attention with a chosen key/value width,
interleaved with plain Swin window attention.

SRFormer's network (``anysr.archs.srformer_arch``, itself SwinIR's layout) with two changes inside each residual
group:

* the PSA blocks project keys and values to ``squeeze_dim`` channels per token (so ``4 * squeeze_dim`` per 2x2
  patch) and queries to ``4 * squeeze_dim``, projected back to ``embed_dim`` (SRFormer: ``embed_dim / 4``); the
  attention scale stays ``(embed_dim // num_heads) ** -0.5``. A window is never shrunk to the training patch, so
  every second PSA block shifts;
* three unshifted Swin blocks (SwinIR's, window 12, shrunk to the patch when that is not larger) join the ``depth``
  PSA blocks, at positions 0, 3 and 6 of the group's block list (appended at the end when the list is shorter),
  as traiNNer-redux inserts them.

Module names, buffers (``relative_position_index``, ``aligned_relative_position_index``, the shifted blocks'
``attn_mask`` for ``img_size``) and constructor arguments are traiNNer-redux's ``SRFormerv2``, so its checkpoints
load with ``strict=True`` and give its output. Attention runs through ``F.scaled_dot_product_attention`` with the
relative-position bias (and the shifted windows' mask, computed for the actual input size) as the additive mask.

Size requirement: the input is reflect-padded (edge-replicated past what reflection reaches) to a multiple of
``tile_multiple``, the least common multiple of ``window_size`` and the Swin blocks' window, and the output
cropped. Where traiNNer-redux runs at all (a padded size the Swin window divides) this is its own padding to
``window_size``; where it fails (window 8 with Swin window 12, say) anysr pads further.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, ShiftedWindowStage, block_drop_rates
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.archs.srformer_arch import PSA_Group, PSABlock
from anysr.archs.swinir_arch import SwinIR, SwinTransformerBlock, swin_sr_arguments
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

SWIN_WINDOW = 12  # the interleaved Swin blocks' window (fixed in the original)
SWIN_POSITIONS = (0, 3, 6)  # list.insert positions of the three Swin blocks, in order


class PSASwinLayer(ShiftedWindowStage):
    """``depth`` PSA blocks (plain and shifted in turn, windows never shrunk) with three unshifted Swin blocks
    inserted at ``SWIN_POSITIONS``."""

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
                             attn_drop=attn_drop, drop_path=rate, norm_layer=norm_layer, squeeze_dim=squeeze_dim,
                             shrink_window=False))
        rate = block_drop_rates(drop_path, depth)[0]
        blocks = list(self.blocks)
        for at in SWIN_POSITIONS:
            blocks.insert(at, SwinTransformerBlock(
                dim, input_resolution, num_heads, window_size=SWIN_WINDOW, shift_size=0, mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop, drop_path=rate,
                norm_layer=norm_layer))
        self.blocks = nn.ModuleList(blocks)
        self.downsample = None

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        return self.run_blocks(x, x_size)


class PSASwinGroup(PSA_Group):
    """SRFormer's residual group (conv and shortcut) around a ``PSASwinLayer``."""

    layer_class = PSASwinLayer


@ARCH_REGISTRY.register()
class SRFormerv2(SwinIR):
    """SRFormerV2 (traiNNer-redux's class, arguments and defaults; ``img_size`` is rounded up to a multiple of
    ``window_size`` as its patch embedding does). ``window_size`` must be even, every ``depths`` entry at least 1,
    ``embed_dim`` and ``4 * squeeze_dim`` multiples of every ``num_heads``. traiNNer-redux's ``srformerv2`` is the
    preset of that name."""

    stage_class = PSASwinGroup

    def __init__(self, *, img_size: int = 64, patch_size: int = 1, in_chans: int = 3, embed_dim: int = 96,
                 squeeze_dim: int = 45, depths: Sequence[int] = (6, 6, 6, 6), num_heads: Sequence[int] = (6, 6, 6, 6),
                 window_size: int = 7, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False, patch_norm: bool = True,
                 use_checkpoint: bool = False, upscale: int = 2, img_range: float = 1.0, upsampler: str = "",
                 resi_connection: str = "1conv") -> None:
        if not isinstance(window_size, int) or window_size < 2 or window_size % 2:
            raise ArchArgumentError("window_size", f"SRFormerv2's permuted windows need an even window_size >= 2, "
                                    f"got {window_size!r}")
        if not isinstance(img_size, int) or img_size < 1:
            raise ArchArgumentError("img_size", f"SRFormerv2: img_size must be a positive integer, got {img_size!r}")
        if not isinstance(squeeze_dim, int) or squeeze_dim < 1:
            raise ArchArgumentError("squeeze_dim", f"SRFormerv2: squeeze_dim must be a positive integer, got "
                                    f"{squeeze_dim!r}")
        if any(not isinstance(d, int) or d < 1 for d in depths):
            raise ArchArgumentError("depths", f"SRFormerv2: every group needs at least one PSA block, got depths "
                                    f"{list(depths)}")
        if any(not isinstance(h, int) or h < 1 or embed_dim % h for h in num_heads):
            raise ArchArgumentError("embed_dim", f"SRFormerv2 needs embed_dim ({embed_dim}) to be a multiple of each "
                                    f"of num_heads {list(num_heads)}")
        if any((4 * squeeze_dim) % h for h in num_heads):
            raise ArchArgumentError("squeeze_dim", f"SRFormerv2 needs 4 * squeeze_dim ({4 * squeeze_dim}) to be a "
                                    f"multiple of each of num_heads {list(num_heads)}")
        self.squeeze_dim = squeeze_dim  # a plain int, read by make_stage while SwinIR's __init__ builds the groups
        rounded = math.ceil(img_size / window_size) * window_size
        super().__init__(img_size=rounded, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                         depths=depths, num_heads=num_heads, window_size=window_size, mlp_ratio=mlp_ratio,
                         qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                         drop_path_rate=drop_path_rate, norm_layer=norm_layer, ape=ape, patch_norm=patch_norm,
                         use_checkpoint=use_checkpoint, upscale=upscale, img_range=img_range, upsampler=upsampler,
                         resi_connection=resi_connection)

    def make_stage(self, *args: Any, **kwargs: Any) -> nn.Module:
        """A ``PSASwinGroup`` with this network's ``squeeze_dim``."""
        return self.stage_class(*args, squeeze_dim=self.squeeze_dim, **kwargs)


__all__ = ["SRFormerv2", "PSASwinGroup", "PSASwinLayer"]

# traiNNer-redux's builder (22.07 M parameters at x4; its ``scale`` is the class's ``upscale``)
register_presets("SRFormerv2", scale_arg="upscale", presets={
    "srformerv2": {"upscale": 4, "window_size": 36, "squeeze_dim": 60, "depths": (4,) * 6, "embed_dim": 240,
                   "num_heads": (8,) * 6, "mlp_ratio": 2.0, "upsampler": "pixelshuffle"},
})


def _recognise(s: StateShapes) -> list[dict]:
    """SRFormerV2 from its tensors: a Swin block first in each group (``attn.qkv``), a PSA block second
    (``attn.kv``); ``swin_sr_arguments`` for the rest, with the PSA window (its half-size bias table has
    ``(window - 1) ** 2`` rows), ``squeeze_dim`` (half the kv width), each group's depth (3 blocks fewer) and the
    training patch (a shifted PSA block's mask windows, the position embedding, or the Swin window when it shrank
    to the patch; else any: the class's default)."""
    s.shape("layers.0.residual_group.blocks.0.attn.qkv.weight")
    first = "layers.0.residual_group.blocks."
    squeeze = s.dim(f"{first}1.attn.kv.weight", 0) // 2

    def window(block: str) -> tuple[int, int]:
        rows, heads = s.shape(block.replace(".blocks.0.", ".blocks.1.") + "attn.relative_position_bias_table")
        return round(rows**0.5) + 1, heads

    proposals = swin_sr_arguments(s, window, "qkv.bias")
    ws = proposals[0]["window_size"]
    stages = s.indices("layers.")
    depths = [s.count(f"layers.{i}.residual_group.blocks.") - len(SWIN_POSITIONS) for i in stages]
    if min(depths) < 1:
        raise NotThisFamily("fewer than 4 blocks in a group")
    swin_window = (round(s.dim(f"{first}0.attn.relative_position_bias_table", 0) ** 0.5) + 1) // 2
    masks = [m for i in stages if (m := f"layers.{i}.residual_group.blocks.2.attn_mask") in s]
    img_size: int | None = None
    if masks:  # (windows, ws * ws, ws * ws / 4) for the rounded patch
        img_size = ws * round(s.dim(masks[0], 0) ** 0.5)
    elif "absolute_pos_embed" in s:
        img_size = round(s.dim("absolute_pos_embed", 1) ** 0.5)
    elif swin_window < SWIN_WINDOW:  # the Swin window shrank to the (rounded) patch
        img_size = swin_window
    out = []
    for p in proposals:
        p = {**p, "depths": depths, "squeeze_dim": squeeze}
        p.pop("img_size", None)
        out.append(p if img_size is None else {**p, "img_size": img_size})
    return out


register_recogniser("SRFormerv2", _recognise)
