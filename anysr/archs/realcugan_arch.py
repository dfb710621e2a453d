"""Real-CUGAN: Real Cascade U-Nets for anime image super-resolution (bilibili AI Lab, 2022; no paper, code at
github.com/bilibili/ailab).

Two cascaded U-Nets of unpadded ("valid") convolutions with squeeze-and-excitation blocks: ``unet1`` upsamples
(a transposed conv, or a conv before PixelShuffle for x4), ``unet2`` refines its result, and the two are added
(``unet2`` sees a border of ``unet1``'s output that the sum crops). Variants, each registered under the class
name spandrel 0.4.2 uses (module names as there, so released checkpoints load with ``strict=True``):

* ``UpCunet2x`` / ``UpCunet3x`` / ``UpCunet4x``: x2 / x3 / x4; ``pro=True`` adds the ``pro`` marker buffer of the
  "pro" checkpoints, which expect their input mapped to [0.15, 0.85] (done here, and undone on the output);
  ``alpha`` (forward argument) scales ``unet2``'s deepest features (the authors' denoise-strength knob);
* ``UpCunet2x_fast``: x2 on a pixel-unshuffled input (a quarter of the work), plus a nearest-upsampled skip.

The input is reflect-padded by the convolutions' receptive border (the authors' forward) and to a multiple of 2
(x3 and fast: 4); reflect padding needs a side of at least 32 (fast: 40), so smaller inputs are first grown at the
bottom / right (reflect, then edge, as spandrel's size requirement does) and the output cropped back.
``tile_multiple``: 2 (x3, fast: 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import pad_bottom_right
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


def _crop(x: torch.Tensor, border: int) -> torch.Tensor:
    return x[..., border:-border, border:-border]


def _lrelu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, 0.1)


class SEBlock(nn.Module):
    """Squeeze-and-excitation: the input times ``sigmoid(conv2(relu(conv1(mean over the image))))``.

    The mean is taken in float32 for half / bfloat16 inputs (as the authors do for half)."""

    def __init__(self, in_channels: int, reduction: int = 8, bias: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, in_channels // reduction, 1, 1, 0, bias=bias)
        self.conv2 = nn.Conv2d(in_channels // reduction, in_channels, 1, 1, 0, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.to(torch.promote_types(x.dtype, torch.float32)).mean(dim=(2, 3), keepdim=True).to(x.dtype)
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(mean))))


class UNetConv(nn.Module):
    """Two unpadded 3x3 convs with LeakyReLU(0.1) (the side shrinks by 4), then an optional SE block."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, se: bool) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, 3, 1, 0), nn.LeakyReLU(0.1),
            nn.Conv2d(mid_channels, out_channels, 3, 1, 0), nn.LeakyReLU(0.1),
        )
        self.seblock = SEBlock(out_channels, reduction=8, bias=True) if se else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.conv(x)
        return z if self.seblock is None else self.seblock(z)


def _init_convs(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


class UNet1(nn.Module):
    """The first (upsampling) U-Net, one level deep. ``up`` 2 or 3: the transposed conv at the bottom upsamples
    (side ``2n - 28`` / ``3n - 42`` for an input side n); ``up`` 1: a plain unpadded conv (side ``n - 16``)."""

    def __init__(self, in_channels: int, out_channels: int, up: int) -> None:
        super().__init__()
        self.conv1 = UNetConv(in_channels, 32, 64, se=False)
        self.conv1_down = nn.Conv2d(64, 64, 2, 2, 0)
        self.conv2 = UNetConv(64, 128, 64, se=True)
        self.conv2_up = nn.ConvTranspose2d(64, 64, 2, 2, 0)
        self.conv3 = nn.Conv2d(64, 64, 3, 1, 0)
        if up == 2:
            self.conv_bottom: nn.Module = nn.ConvTranspose2d(64, out_channels, 4, 2, 3)
        elif up == 3:
            self.conv_bottom = nn.ConvTranspose2d(64, out_channels, 5, 3, 2)
        else:
            self.conv_bottom = nn.Conv2d(64, out_channels, 3, 1, 0)
        _init_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.conv1(x)
        x2 = self.conv2(_lrelu(self.conv1_down(x1)))
        x2 = _lrelu(self.conv2_up(x2))
        x3 = _lrelu(self.conv3(_crop(x1, 4) + x2))
        return self.conv_bottom(x3)


class UNet2(nn.Module):
    """The second (refining) U-Net, two levels deep; the side shrinks by 40."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = UNetConv(in_channels, 32, 64, se=False)
        self.conv1_down = nn.Conv2d(64, 64, 2, 2, 0)
        self.conv2 = UNetConv(64, 64, 128, se=True)
        self.conv2_down = nn.Conv2d(128, 128, 2, 2, 0)
        self.conv3 = UNetConv(128, 256, 128, se=True)
        self.conv3_up = nn.ConvTranspose2d(128, 128, 2, 2, 0)
        self.conv4 = UNetConv(128, 64, 64, se=True)
        self.conv4_up = nn.ConvTranspose2d(64, 64, 2, 2, 0)
        self.conv5 = nn.Conv2d(64, 64, 3, 1, 0)
        self.conv_bottom = nn.Conv2d(64, out_channels, 3, 1, 0)
        _init_convs(self)

    def forward(self, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        x1 = self.conv1(x)
        x2 = self.conv2(_lrelu(self.conv1_down(x1)))
        x3 = self.conv3(_lrelu(self.conv2_down(x2)))
        x3 = _lrelu(self.conv3_up(x3))
        x4 = self.conv4(_crop(x2, 4) + x3)
        if alpha != 1:
            x4 = x4 * alpha
        x4 = _lrelu(self.conv4_up(x4))
        x5 = _lrelu(self.conv5(_crop(x1, 16) + x4))
        return self.conv_bottom(x5)


class _UpCunetBase(nn.Module):
    """What the variants share: the ``pro`` marker buffer and input range, the padding and the crop.

    ``border``: reflect padding around the input (what the unpadded convolutions eat); ``tile_multiple``: the
    side multiple the bottom / right reflect padding rounds up to; ``min_size`` (and for the fast variant
    ``size_multiple``): spandrel's size requirement, applied first; ``skip``: add the nearest-upsampled input."""

    scale: int
    border: int
    min_size: int = 32
    size_multiple: int = 1
    tile_multiple: int = 2
    skip: bool = False

    def _init_pro(self, pro: bool) -> None:
        self.pro: torch.Tensor | None
        if pro:
            self.register_buffer("pro", torch.zeros(1))
        else:
            self.pro = None

    @property
    def is_pro(self) -> bool:
        return self.pro is not None

    def _run(self, x: torch.Tensor, alpha: float) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """Upscale ``x`` (b, c, h, w) in [0, 1] by ``scale``; ``alpha`` scales ``unet2``'s deepest features."""
        h, w = x.shape[-2:]
        s, b, m = self.scale, self.border, self.tile_multiple
        big_h, big_w = max(h, self.min_size), max(w, self.min_size)
        x = pad_bottom_right(x, big_h + (-big_h) % self.size_multiple - h, big_w + (-big_w) % self.size_multiple - w)
        hh, ww = x.shape[-2:]
        if self.is_pro:
            x = x * 0.7 + 0.15
        out = self._run(F.pad(x, (b, b + (-ww) % m, b, b + (-hh) % m), mode="reflect"), alpha)
        out = out[..., : hh * s, : ww * s]
        if self.skip:
            out = out + F.interpolate(x, scale_factor=s, mode="nearest")
        out = out[..., : h * s, : w * s]
        return (out - 0.15) / 0.7 if self.is_pro else out


class _UpCunetDirect(_UpCunetBase):
    """x2 and x3: ``unet1`` upsamples to the output channels, ``unet2`` adds its refinement."""

    def _build(self, in_channels: int, out_channels: int, pro: bool) -> None:
        self.in_channels = in_channels
        self._init_pro(pro)
        self.unet1 = UNet1(in_channels, out_channels, up=self.scale)
        self.unet2 = UNet2(in_channels, out_channels)

    def _run(self, x: torch.Tensor, alpha: float) -> torch.Tensor:
        x = self.unet1(x)
        return _crop(x, 20) + self.unet2(x, alpha)


@ARCH_REGISTRY.register()
class UpCunet2x(_UpCunetDirect):
    """Real-CUGAN x2 (``pro``: the "pro" checkpoints' input range and marker buffer)."""

    scale = 2
    border = 18

    def __init__(self, *, in_channels: int = 3, out_channels: int = 3, pro: bool = False) -> None:
        super().__init__()
        self._build(in_channels, out_channels, pro)


@ARCH_REGISTRY.register()
class UpCunet3x(_UpCunetDirect):
    """Real-CUGAN x3 (``pro``: the "pro" checkpoints' input range and marker buffer)."""

    scale = 3
    border = 14
    tile_multiple = 4

    def __init__(self, *, in_channels: int = 3, out_channels: int = 3, pro: bool = False) -> None:
        super().__init__()
        self._build(in_channels, out_channels, pro)


class _UpCunetPixelShuffle(_UpCunetBase):
    """x4 and fast x2: the U-Nets work on 64 channels; ``conv_final`` + PixelShuffle make the image."""

    skip = True

    def _build(self, in_channels: int, unet_in: int, out_channels: int, pro: bool) -> None:
        self.in_channels = in_channels
        self._init_pro(pro)
        self.unet1 = UNet1(unet_in, 64, up=2)
        self.unet2 = UNet2(64, 64)
        self.ps = nn.PixelShuffle(2)
        self.conv_final = nn.Conv2d(64, 4 * out_channels, 3, 1, padding=0, bias=True)

    def _run(self, x: torch.Tensor, alpha: float) -> torch.Tensor:
        y = self.unet1(x)
        return self.ps(_crop(self.conv_final(_crop(y, 20) + self.unet2(y, alpha)), 1))


@ARCH_REGISTRY.register()
class UpCunet4x(_UpCunetPixelShuffle):
    """Real-CUGAN x4: the U-Nets work on 64 channels at x2; a conv + PixelShuffle makes x4, and the
    nearest-upsampled input is added (``pro``: the "pro" checkpoints' input range and marker buffer)."""

    scale = 4
    border = 19

    def __init__(self, *, in_channels: int = 3, out_channels: int = 3, pro: bool = False) -> None:
        super().__init__()
        self._build(in_channels, in_channels, out_channels, pro)


@ARCH_REGISTRY.register()
class UpCunet2x_fast(_UpCunetPixelShuffle):  # noqa: N801 - spandrel's class name is the registered type name
    """Real-CUGAN x2 "fast": the U-Nets run on the pixel-unshuffled (half-size, 4x channels) input; a conv +
    PixelShuffle returns to x2, plus the nearest-upsampled input. Sides below 40 or not a multiple of 4 are
    grown first (spandrel's size requirement)."""

    scale = 2
    border = 38
    min_size = 40
    size_multiple = 4
    tile_multiple = 4

    def __init__(self, *, in_channels: int = 3, out_channels: int = 3) -> None:
        super().__init__()
        self._build(in_channels, 4 * in_channels, out_channels, False)
        self.inv = nn.PixelUnshuffle(2)

    def _run(self, x: torch.Tensor, alpha: float) -> torch.Tensor:
        return super()._run(self.inv(x), alpha)


def _trainner_realcugan(args: dict[str, Any]) -> dict[str, Any]:
    """traiNNer-redux's one ``realcugan`` name picks the class by ``scale`` (and ``fast``, only at x2)."""
    scale, fast = args.pop("scale", 4), bool(args.pop("fast", False))
    if fast and scale != 2:
        raise ValueError(f"fast: true is only available at scale 2 (UpCunet2x_fast), not {scale}")
    kinds = {2: "UpCunet2x_fast" if fast else "UpCunet2x", 3: "UpCunet3x", 4: "UpCunet4x"}
    if scale not in kinds:
        raise ValueError(f"realcugan: scale {scale} is not available; Real-CUGAN has x2, x3 and x4 networks")
    return {"type": kinds[scale], **args}


# traiNNer-redux's name (tests/test_presets.py checks it against the network its builder makes at x4).
register_presets("UpCunet4x", scale_arg="scale", translate=_trainner_realcugan, accepts=("fast",), presets={
    "realcugan": {},  # 1.41 M parameters at x4
})


def _neosr_cugan(args: dict[str, Any]) -> dict[str, Any]:
    """neosr's one ``cugan`` name picks the class by ``scale``, with the "pro" marker buffer by default."""
    scale = args.pop("scale", 4)
    kinds = {2: "UpCunet2x", 3: "UpCunet3x", 4: "UpCunet4x"}
    if scale not in kinds:
        raise ValueError(f"cugan: scale {scale} is not available; Real-CUGAN has x2, x3 and x4 networks")
    return {"type": kinds[scale], **args}


# neosr's name (tests/test_neosr_names.py checks it against the network neosr builds)
register_presets("UpCunet4x", scale_arg="scale", translate=_neosr_cugan, source="neosr", presets={
    "cugan": {"pro": True},  # 1.41 M parameters at x4
})


__all__ = ["SEBlock", "UNet1", "UNet2", "UNetConv", "UpCunet2x", "UpCunet2x_fast", "UpCunet3x", "UpCunet4x"]


def _direct(scale: int, kernel: int) -> Callable[[StateShapes], dict | None]:
    def recognise(s: StateShapes) -> dict | None:
        """Real-CUGAN x2 / x3 from its tensors: image channels from the first and last convs, the scale from
        the first U-Net's transposed conv (kernel 4: x2, 5: x3), ``pro`` from its marker buffer."""
        if s.dim("unet1.conv_bottom.weight", 2) != kernel:
            return None
        return {"in_channels": s.dim("unet1.conv1.conv.0.weight", 1),
                "out_channels": s.dim("unet2.conv_bottom.weight", 0), "pro": "pro" in s}

    recognise.__name__ = f"_recognise_x{scale}"
    return recognise


def _recognise_x4(s: StateShapes) -> dict | None:
    """Real-CUGAN x4 from its tensors: image channels from the first conv and the PixelShuffle conv, ``pro`` from
    its marker buffer. A first conv reading 4x the output's channels is the fast x2 (its input unshuffled)."""
    cin, cout = s.dim("unet1.conv1.conv.0.weight", 1), s.dim("conv_final.weight", 0) // 4
    return None if cin == 4 * cout else {"in_channels": cin, "out_channels": cout, "pro": "pro" in s}


def _recognise_x2_fast(s: StateShapes) -> dict | None:
    """Real-CUGAN fast x2 from its tensors: the first conv reads the pixel-unshuffled input (4x the channels).
    Only image channels in = out are proposed (fast x2 with others has the tensors of an x4 network)."""
    cin, cout = s.dim("unet1.conv1.conv.0.weight", 1), s.dim("conv_final.weight", 0) // 4
    return {"in_channels": cout, "out_channels": cout} if cin == 4 * cout else None


register_recogniser("UpCunet2x", _direct(2, 4))
register_recogniser("UpCunet3x", _direct(3, 5))
register_recogniser("UpCunet4x", _recognise_x4)
register_recogniser("UpCunet2x_fast", _recognise_x2_fast)
