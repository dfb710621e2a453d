"""DRUNet: the residual U-Net denoiser of DPIR (Zhang, Li, Zuo, Zhang, Van Gool and Timofte, "Plug-and-Play Image
Restoration with Deep Denoiser Prior", IEEE TPAMI 2021).

A four-level U-Net without biases: ``nb`` residual blocks per level, stride-2 conv (or pool + conv) down, 2x2
transposed conv (or PixelShuffle / nearest upsampling + conv) up, additive skip connections. The network reads a
noise-level map as its last input channel: give it ``in_nc - 1`` image channels and the map is appended
(``noise_level``, default 15/255 as spandrel's call; 0 to 1 units, per call or per sample), or all ``in_nc``
channels to supply your own. Layer names follow the authors' code (as in spandrel 0.4.2), so released checkpoints
load with ``strict=True``.

Size: three halvings need sides that are multiples of 8; other inputs are padded at the bottom / right inside
``forward`` (reflect, then edge, as spandrel's size requirement does) and the output cropped
(``tile_multiple`` = 8). Scale 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.dpir_util import ResBlock, append_noise_map, chain, check_act_mode, downsample, upsample
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


def check_widths(nc: Sequence[int]) -> list[int]:
    """Four positive level widths, or ArchArgumentError."""
    widths = list(nc) if isinstance(nc, Sequence) and not isinstance(nc, str) else []
    if len(widths) != 4 or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in widths):
        raise ArchArgumentError("nc", f"expected the widths of the four U-Net levels, e.g. [64, 128, 256, 512], "
                                f"got {nc!r}")
    return widths


@ARCH_REGISTRY.register()
class DRUNet(nn.Module):
    """DRUNet (the DPIR denoiser).

    Args:
        in_nc: input channels including the noise-level map (4 for the colour model, 2 for grayscale).
        out_nc: output channels. nc: widths of the four levels. nb: residual blocks per level.
        act_mode: activation letters inside the residual blocks ('R': ReLU).
        downsample_mode: 'strideconv' or 'avgpool' ('maxpool' cannot run, see ``dpir_util.downsample``).
        upsample_mode: 'convtranspose', 'pixelshuffle' or 'upconv'.
    """

    tile_multiple: int = 8
    noise_level: float = 15 / 255

    def __init__(self, *, in_nc: int = 1, out_nc: int = 1, nc: Sequence[int] = (64, 128, 256, 512), nb: int = 4,
                 act_mode: str = "R", downsample_mode: str = "strideconv",
                 upsample_mode: str = "convtranspose") -> None:
        super().__init__()
        check_act_mode(act_mode)
        c = check_widths(nc)
        self.in_nc = in_nc
        # What a caller feeds: the last input channel is the noise map (appended here); in_nc=1 has no room for it.
        self.in_channels = in_nc - 1 if in_nc > 1 else in_nc
        block = "C" + act_mode + "C"

        def blocks(width: int) -> list[nn.Module]:
            return [ResBlock(width, block, bias=False) for _ in range(nb)]

        self.m_head = nn.Conv2d(in_nc, c[0], 3, 1, 1, bias=False)
        self.m_down1 = chain(*blocks(c[0]), downsample(downsample_mode, c[0], c[1], False))
        self.m_down2 = chain(*blocks(c[1]), downsample(downsample_mode, c[1], c[2], False))
        self.m_down3 = chain(*blocks(c[2]), downsample(downsample_mode, c[2], c[3], False))
        self.m_body = chain(*blocks(c[3]))
        self.m_up3 = chain(upsample(upsample_mode, c[3], c[2], False), *blocks(c[2]))
        self.m_up2 = chain(upsample(upsample_mode, c[2], c[1], False), *blocks(c[1]))
        self.m_up1 = chain(upsample(upsample_mode, c[1], c[0], False), *blocks(c[0]))
        self.m_tail = nn.Conv2d(c[0], out_nc, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor, noise_level: float | torch.Tensor | None = None) -> torch.Tensor:
        """Denoise ``x``; ``noise_level`` fills the appended noise map (default ``self.noise_level``)."""
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.tile_multiple)
        x = append_noise_map(x, self.in_nc, self.noise_level if noise_level is None else noise_level)
        x1 = self.m_head(x)
        x2 = self.m_down1(x1)
        x3 = self.m_down2(x2)
        x4 = self.m_down3(x3)
        y = self.m_up3(self.m_body(x4) + x4)
        y = self.m_up2(y + x3)
        y = self.m_up1(y + x2)
        return self.m_tail(y + x1)[..., :h, :w]


__all__ = ["DRUNet", "check_widths"]


def unet_modes(s: StateShapes, down: str, up: str, nb: int) -> tuple[str, str]:
    """The (downsample_mode, upsample_mode) of a DPIR U-Net read from its tensors: ``down`` the first encoder
    stage's prefix (its layer after the ``nb`` blocks is a 2x2 conv, or a pool then a 3x3 conv), ``up`` the first
    decoder upsampler's prefix (a 2x2 transposed conv, a 3x3 conv to 4x channels, or nearest + conv)."""
    down_mode = "strideconv" if f"{down}.{nb}.weight" in s else "avgpool"
    if f"{up}.weight" in s:
        w = s.shape(f"{up}.weight")
        up_mode = "convtranspose" if w[-1] == 2 else "pixelshuffle"
    elif f"{up}.0.weight" in s:
        up_mode = "pixelshuffle"
    else:
        up_mode = "upconv"
    return down_mode, up_mode


def _recognise(s: StateShapes) -> dict:
    """DRUNet from its tensors: the four level widths from each level's first block, blocks per level from the
    bottleneck, channels from the head / tail convs, the resampling kinds from the layer shapes."""
    nb = s.count("m_body.") or 1  # one block is the stage itself (no index)
    body = "m_body.0" if nb > 1 else "m_body"
    nc = [s.dim("m_head.weight", 0), s.dim("m_down2.0.res.0.weight", 0), s.dim("m_down3.0.res.0.weight", 0),
          s.dim(f"{body}.res.0.weight", 0)]
    down, up = unet_modes(s, "m_down1", "m_up3.0", nb)
    return {"in_nc": s.dim("m_head.weight", 1), "out_nc": s.dim("m_tail.weight", 0), "nc": nc, "nb": nb,
            "downsample_mode": down, "upsample_mode": up}


register_recogniser("DRUNet", _recognise)
