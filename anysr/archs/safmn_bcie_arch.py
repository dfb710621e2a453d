"""SAFMN-BCIE: SAFMN for blind compressed image enhancement (Sun et al., "SAFMN++", NTIRE 2024 / CVPR Workshops
2024): a scale-1 restoration network.

Module names and constructor arguments follow spandrel 0.4.2's ``SAFMNBCIE`` (class ``SAFMN_BCIE``), so
released checkpoints load with ``strict=True`` and give the same output. The image is pixel-unshuffled by
``upscaling_factor``, passes ``n_blocks`` groups of ``num_layers`` SAFMN attention blocks (each group closed by
a 3x3 conv and a shortcut) and is brought back to full resolution by conv + PixelShuffle + a 3x3 conv to RGB.
The blocks are SAFMN's (``anysr.archs.safmn_arch``).

Size requirement: the sides must be multiples of ``upscaling_factor`` (pixel unshuffle) and at least
``8 * upscaling_factor`` (the pooling pyramid); other sizes are padded at the bottom / right (reflect, then
edge replication) and the output cropped. ``tile_multiple`` is ``8 * upscaling_factor`` (16 for the
released model), spandrel's size requirement.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, pad_bottom_right
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.safmn_arch import N_LEVELS, AttBlock, ffn_scales
from anysr.registry import ARCH_REGISTRY


class BasicLayer(nn.Module):
    """``num_layer`` SAFMN attention blocks, a 3x3 conv, plus the input."""

    def __init__(self, num_layer: int, dim: int, ffn_scale: float = 2.0) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[AttBlock(dim, ffn_scale) for _ in range(num_layer)])
        self.conv = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.layers(x)) + x


@ARCH_REGISTRY.register()
class SAFMNBCIE(nn.Module):
    """SAFMN-BCIE: PixelUnshuffle + 3x3 conv, ``n_blocks`` BasicLayers with a long shortcut, then
    conv + PixelShuffle + 3x3 conv. RGB in and out, same size (scale 1).

    Args:
        dim: width (a multiple of 4). n_blocks: groups. num_layers: attention blocks per group.
        ffn_scale: hidden width factor of the channel mixers. upscaling_factor: the pixel-unshuffle factor
        (the network works at 1/upscaling_factor of the resolution).
    """

    scale: int = 1
    in_channels: int = 3  # what it reads (its first conv sees the pixel-unshuffled channels)

    def __init__(self, dim: int, n_blocks: int = 6, num_layers: int = 6, ffn_scale: float = 2.0,
                 upscaling_factor: int = 2) -> None:
        super().__init__()
        f = upscaling_factor
        if isinstance(f, bool) or not isinstance(f, int) or f < 1:
            raise ArchArgumentError("upscaling_factor", f"SAFMNBCIE needs an integer upscaling_factor >= 1, "
                                    f"got {f!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < N_LEVELS or dim % N_LEVELS:
            raise ArchArgumentError("dim", f"SAFMNBCIE needs dim to be a multiple of {N_LEVELS} (one chunk per "
                                    f"pyramid level), got {dim!r}")
        self.factor = f
        self.tile_multiple = 2 ** (N_LEVELS - 1) * f
        self.to_feat = nn.Sequential(nn.PixelUnshuffle(f), nn.Conv2d(3 * f**2, dim, 3, 1, 1))
        self.feats = nn.Sequential(*[BasicLayer(num_layers, dim, ffn_scale) for _ in range(n_blocks)])
        self.to_img = nn.Sequential(nn.Conv2d(dim, dim * f**2, 3, 1, 1), nn.PixelShuffle(f),
                                    nn.Conv2d(dim, 3, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        f = self.factor
        # one padding step to max(side, 8f) rounded up to a multiple of f (spandrel's SizeRequirements order)
        m = self.tile_multiple
        x = pad_bottom_right(x, max(-(-h // f) * f, m) - h, max(-(-w // f) * f, m) - w)
        feat = self.to_feat(x)
        return self.to_img(self.feats(feat) + feat)[..., :h, :w]


__all__ = ["SAFMNBCIE"]


def _recognise(s: StateShapes) -> list[dict]:
    """SAFMNBCIE from its tensors: width and the unshuffle factor from the first conv (3 * f**2 inputs), groups
    and blocks per group from the body, the mixer's hidden width from the first block."""
    dim = s.dim("to_feat.1.weight", 0)
    fold = [f for c, f in shuffle_splits(s.dim("to_feat.1.weight", 1), (3,))]
    hidden = s.dim("feats.0.layers.0.ccm.ccm.0.weight", 0) if "feats.0.layers.0.ccm.ccm.0.weight" in s else 2 * dim
    return [{"dim": dim, "n_blocks": s.count("feats."), "num_layers": s.count("feats.0.layers."), "ffn_scale": r,
             "upscaling_factor": f} for f in fold for r in ffn_scales(hidden, dim)]


register_recogniser("SAFMNBCIE", _recognise)
