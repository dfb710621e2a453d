"""StyleGAN2 generator and discriminator with BasicSR 1.4.2's parameter layout.

StyleGAN2: "Analyzing and Improving the Image Quality of StyleGAN" (Karras, Laine, Aittala, Hellsten, Lehtinen,
Aila; CVPR 2020). BasicSR's port (from rosinality's stylegan2-pytorch) runs on custom CUDA kernels (``fused_act``,
``upfirdn2d``); this module computes the same functions in plain PyTorch (the kernels' reference math), so the
networks run on any device, compile once under XLA and export to ONNX.

* ``StyleGAN2Generator``: style codes (b, num_style_feat) -> image (b, 3, out_size, out_size). An 8-layer
  equalised-lr MLP maps codes to latents; a learned 4x4 constant is refined by weight-modulated 3x3
  convolutions, doubled in size per level (transposed conv + FIR smoothing) up to ``out_size``, with an RGB skip
  branch summed over the levels.
* ``StyleGAN2Discriminator``: image (b, 3, out_size, out_size) -> one score per image, via residual blocks that
  halve the size (FIR blur + strided conv), a minibatch-stddev channel and two equalised linear layers.

Size requirement: ``out_size`` is a power of two from 8 to 1024 (the authors use 512 / 1024 faces); the discriminator
takes exactly ``out_size`` x ``out_size`` images and a batch that is a multiple of ``stddev_group`` (or smaller).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, width_ratio
from anysr.registry import ARCH_REGISTRY

SQRT2 = math.sqrt(2.0)


# ------------------------------------------------------------------------------------------- shared helpers

def check_out_size(out_size: int, owner: str, arg: str = "out_size") -> int:
    """``log2(out_size)``; ArchArgumentError unless ``out_size`` is a power of two of at least 8 and at most 1024
    (the sizes the channel table covers)."""
    if isinstance(out_size, bool) or not isinstance(out_size, int) or out_size < 8 or out_size > 1024 \
            or out_size & (out_size - 1):
        raise ArchArgumentError(arg, f"{owner} needs a power-of-two {arg} between 8 and 1024, got {out_size!r}")
    return int(math.log2(out_size))


def stylegan_channels(channel_multiplier: float, narrow: float) -> dict[str, int]:
    """StyleGAN2's feature width per resolution ('4' ... '1024'): 512 up to 32 pixels, then halving per level
    (scaled by ``channel_multiplier`` from 64 pixels on); everything times ``narrow``."""
    table = {str(2**i): int(512 * narrow) for i in range(2, 6)}
    for i, base in zip(range(6, 11), (256, 128, 64, 32, 16), strict=True):
        table[str(2**i)] = int(base * channel_multiplier * narrow)
    return table


def mix_latents(styles: Sequence[torch.Tensor] | torch.Tensor, num_latent: int,
                inject_index: int | torch.Tensor | None) -> torch.Tensor:
    """Per-layer latents (b, num_latent, c) from one code (repeated; a (b, n, c) code is used as it is) or two
    codes (style mixing: the first for layers before ``inject_index``, random in [1, num_latent) when None).

    ``inject_index`` as a 0-d integer tensor selects by a mask instead of slicing: one graph for every index
    (XLA compiles once), and ``num_latent`` means no mixing (the first code everywhere)."""
    if isinstance(styles, torch.Tensor):
        styles = [styles]
    if len(styles) == 1:
        code = styles[0]
        return code if code.ndim == 3 else code.unsqueeze(1).expand(-1, num_latent, -1)
    if len(styles) != 2:
        raise ValueError(f"StyleGAN2 mixes at most two style codes, got {len(styles)}")
    if isinstance(inject_index, torch.Tensor):
        before = torch.arange(num_latent, device=styles[0].device) < inject_index.to(styles[0].device)
        return torch.where(before[None, :, None], styles[0].unsqueeze(1), styles[1].unsqueeze(1))
    if inject_index is None:
        inject_index = random.randint(1, num_latent - 1)
    first = styles[0].unsqueeze(1).expand(-1, inject_index, -1)
    second = styles[1].unsqueeze(1).expand(-1, num_latent - inject_index, -1)
    return torch.cat([first, second], 1)


def truncate(styles: Sequence[torch.Tensor], truncation: float, truncation_latent: torch.Tensor | None
             ) -> list[torch.Tensor]:
    """The truncation trick: pull each style toward ``truncation_latent`` (no-op for ``truncation >= 1``)."""
    if truncation >= 1:
        return list(styles)
    if truncation_latent is None:
        raise ValueError("truncation < 1 needs truncation_latent (for example the generator's mean_latent())")
    return [truncation_latent + truncation * (s - truncation_latent) for s in styles]


def noise_like(out: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """``noise`` or fresh standard-normal noise of one channel, on ``out``'s device and dtype."""
    if noise is not None:
        return noise.to(out.dtype)
    b, _, h, w = out.shape
    return torch.randn((b, 1, h, w), device=out.device, dtype=out.dtype)


def modulated_conv(x: torch.Tensor, weight: torch.Tensor, style: torch.Tensor, demodulate: bool, eps: float,
                   mode: str | None, padding: int) -> torch.Tensor:
    """StyleGAN2's weight-modulated convolution computed by modulating activations: ``conv(x * style) * demod``.

    ``weight`` (out, in, k, k) already carries any equalised-lr scale; ``style`` (b, in). Equal to convolving each
    sample with its own ``weight * style`` (demodulated), without a per-sample weight tensor or grouped
    convolution. ``mode``: None (stride 1, ``padding``), 'up' (transposed conv, stride 2, no padding) or 'down'
    (stride 2, no padding).
    """
    x = x * style.to(x.dtype)[:, :, None, None]
    w = weight.to(x.dtype)
    if mode == "up":
        out = F.conv_transpose2d(x, w.transpose(0, 1), stride=2)
    elif mode == "down":
        out = F.conv2d(x, w, stride=2)
    else:
        out = F.conv2d(x, w, padding=padding)
    if demodulate:
        energy = w.square().sum((2, 3))  # (out, in)
        demod = torch.rsqrt(style.to(x.dtype).square() @ energy.t() + eps)  # (b, out)
        out = out * demod[:, :, None, None]
    return out


# ------------------------------------------------------------------------------------------- FIR resampling

def fir_kernel(taps: Sequence[float]) -> torch.Tensor:
    """A normalised 2-D FIR kernel: the outer product of 1-D ``taps`` (or the 2-D taps), summing to one."""
    k = torch.tensor(taps, dtype=torch.float32)
    if k.ndim == 1:
        k = k[:, None] * k[None, :]
    return k / k.sum()


def upfirdn2d(x: torch.Tensor, kernel: torch.Tensor, up: int = 1, down: int = 1,
              pad: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """Upsample by zero insertion, pad, filter with ``kernel`` (true convolution), keep every ``down``-th pixel.

    The function of BasicSR's ``upfirdn2d`` op (same pad convention: ``pad[0]`` before, ``pad[1]`` after, on both
    axes; negative pads crop), as one depth-wise convolution.
    """
    b, c, h, w = x.shape
    if up > 1:
        x = F.pad(x[:, :, :, None, :, None], (0, up - 1, 0, 0, 0, up - 1)).reshape(b, c, h * up, w * up)
    x = F.pad(x, (pad[0], pad[1], pad[0], pad[1]))
    k = kernel.to(x.dtype).flip((0, 1))
    return F.conv2d(x, k.expand(c, 1, *k.shape), stride=down, groups=c)


class FIRResample(nn.Module):
    """A fixed FIR step of StyleGAN2 (``upfirdn2d`` with a kernel buffer that is not saved in checkpoints)."""

    def __init__(self, taps: Sequence[float], up: int, down: int, pad: tuple[int, int], gain: float) -> None:
        super().__init__()
        self.register_buffer("kernel", fir_kernel(taps) * gain, persistent=False)
        self.up, self.down, self.pad = up, down, pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, self.up, self.down, self.pad)

    def extra_repr(self) -> str:
        return f"up={self.up}, down={self.down}, pad={self.pad}"


def fir_upsample(taps: Sequence[float], factor: int = 2) -> FIRResample:
    """Upsample by ``factor`` (zero insertion + FIR interpolation), BasicSR's ``UpFirDnUpsample``."""
    p = len(taps) - factor
    return FIRResample(taps, factor, 1, ((p + 1) // 2 + factor - 1, p // 2), factor**2)


def fir_smooth(taps: Sequence[float], kernel_size: int, up: int = 1, down: int = 1) -> FIRResample:
    """The blur around a stride-2 (transposed) convolution of ``kernel_size``, BasicSR's ``UpFirDnSmooth``."""
    if up > 1:
        p = len(taps) - up - (kernel_size - 1)
        return FIRResample(taps, 1, 1, ((p + 1) // 2 + up - 1, p // 2 + 1), up**2)
    p = len(taps) - down + (kernel_size - 1)
    return FIRResample(taps, 1, 1, ((p + 1) // 2, p // 2), 1.0)


# ------------------------------------------------------------------------------------------- layers

def bias_leaky_relu(x: torch.Tensor, bias: torch.Tensor | None, negative_slope: float = 0.2,
                    scale: float = SQRT2) -> torch.Tensor:
    """``leaky_relu(x + bias) * scale`` with the bias on dim 1 (BasicSR's ``fused_leaky_relu``)."""
    if bias is not None:
        x = x + bias.to(x.dtype).view(1, -1, *([1] * (x.ndim - 2)))
    return F.leaky_relu(x, negative_slope) * scale


class FusedLeakyReLU(nn.Module):
    """A learned per-channel bias, then leaky ReLU (slope 0.2) times sqrt(2). Parameter: ``bias`` (C,)."""

    def __init__(self, channel: int, negative_slope: float = 0.2, scale: float = SQRT2) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channel))
        self.negative_slope, self.scale = negative_slope, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_leaky_relu(x, self.bias, self.negative_slope, self.scale)


class ScaledLeakyReLU(nn.Module):
    """Leaky ReLU times sqrt(2) (no bias)."""

    def __init__(self, negative_slope: float = 0.2) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.negative_slope) * SQRT2


class EqualLinear(nn.Module):
    """Linear layer with the equalised learning rate: weights stored as N(0, 1) / ``lr_mul`` and scaled by
    ``lr_mul / sqrt(in)`` at run time; ``activation='fused_lrelu'`` adds the bias inside the leaky ReLU."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, bias_init_val: float = 0,
                 lr_mul: float = 1, activation: str | None = None) -> None:
        super().__init__()
        if activation not in ("fused_lrelu", None):
            raise ArchArgumentError("activation", f"EqualLinear: activation must be 'fused_lrelu' or None, got "
                                    f"{activation!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lr_mul, self.activation = lr_mul, activation
        self.scale = lr_mul / math.sqrt(in_channels)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels) / lr_mul)
        self.bias = nn.Parameter(torch.full((out_channels,), float(bias_init_val))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias * self.lr_mul
        if self.activation == "fused_lrelu":
            return bias_leaky_relu(F.linear(x, self.weight * self.scale), bias)
        return F.linear(x, self.weight * self.scale, bias)


class EqualConv2d(nn.Module):
    """Conv2d with the equalised learning rate (weight N(0, 1) scaled by ``1 / sqrt(in * k * k)``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True, bias_init_val: float = 0) -> None:
        super().__init__()
        self.stride, self.padding = stride, padding
        self.scale = 1 / math.sqrt(in_channels * kernel_size**2)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.full((out_channels,), float(bias_init_val))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.scale, self.bias, stride=self.stride, padding=self.padding)


class NormStyleCode(nn.Module):
    """Pixel norm of style codes: ``x / sqrt(mean(x^2) + 1e-8)`` over the feature dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(1, keepdim=True) + 1e-8)


class ModulatedConv2d(nn.Module):
    """Weight-modulated (and optionally demodulated) convolution without bias; ``sample_mode`` 'upsample' is a
    stride-2 transposed conv followed by FIR smoothing, 'downsample' FIR smoothing then a stride-2 conv.
    Parameters ``weight`` (1, out, in, k, k) and ``modulation`` (an EqualLinear, bias initialised to 1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_style_feat: int,
                 demodulate: bool = True, sample_mode: str | None = None,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1), eps: float = 1e-8) -> None:
        super().__init__()
        if sample_mode not in ("upsample", "downsample", None):
            raise ArchArgumentError("sample_mode", f"ModulatedConv2d: sample_mode must be 'upsample', 'downsample' "
                                    f"or None, got {sample_mode!r}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.demodulate, self.sample_mode, self.eps = demodulate, sample_mode, eps
        if sample_mode == "upsample":
            self.smooth = fir_smooth(resample_kernel, kernel_size, up=2)
        elif sample_mode == "downsample":
            self.smooth = fir_smooth(resample_kernel, kernel_size, down=2)
        self.scale = 1 / math.sqrt(in_channels * kernel_size**2)
        self.modulation = EqualLinear(num_style_feat, in_channels, bias=True, bias_init_val=1)
        self.weight = nn.Parameter(torch.randn(1, out_channels, in_channels, kernel_size, kernel_size))
        self.padding = kernel_size // 2

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        s = self.modulation(style)
        w = self.weight[0] * self.scale
        if self.sample_mode == "upsample":
            return self.smooth(modulated_conv(x, w, s, self.demodulate, self.eps, "up", 0))
        if self.sample_mode == "downsample":
            return modulated_conv(self.smooth(x), w, s, self.demodulate, self.eps, "down", 0)
        return modulated_conv(x, w, s, self.demodulate, self.eps, None, self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"demodulate={self.demodulate}, sample_mode={self.sample_mode}")


class StyleConv(nn.Module):
    """Modulated conv, per-pixel noise scaled by the learned ``weight``, bias + leaky ReLU (``activate``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_style_feat: int,
                 demodulate: bool = True, sample_mode: str | None = None,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1)) -> None:
        super().__init__()
        self.modulated_conv = ModulatedConv2d(in_channels, out_channels, kernel_size, num_style_feat,
                                              demodulate=demodulate, sample_mode=sample_mode,
                                              resample_kernel=resample_kernel)
        self.weight = nn.Parameter(torch.zeros(1))  # noise strength
        self.activate = FusedLeakyReLU(out_channels)

    def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        out = self.modulated_conv(x, style)
        return self.activate(out + self.weight * noise_like(out, noise))


class ToRGB(nn.Module):
    """1x1 modulated conv to RGB (no demodulation) plus ``bias``, added to the FIR-upsampled previous RGB."""

    def __init__(self, in_channels: int, num_style_feat: int, upsample: bool = True,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1)) -> None:
        super().__init__()
        self.upsample = fir_upsample(resample_kernel) if upsample else None
        self.modulated_conv = ModulatedConv2d(in_channels, 3, 1, num_style_feat, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(self, x: torch.Tensor, style: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        out = self.modulated_conv(x, style) + self.bias
        if skip is None:
            return out
        return out + (self.upsample(skip) if self.upsample is not None else skip)


class ConstantInput(nn.Module):
    """The learned (1, C, size, size) start of the generator, broadcast to the batch."""

    def __init__(self, num_channel: int, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, num_channel, size, size))

    def forward(self, batch: int) -> torch.Tensor:
        return self.weight.expand(batch, -1, -1, -1)


class StyleGeneratorBase(nn.Module):
    """What BasicSR's StyleGAN2 generators share: the layer schedule, the stored noise buffers
    (``noises.noise<i>``, one per style conv), the latent mixing and the synthesis loop. A subclass builds
    ``style_mlp``, ``constant_input``, ``style_conv1``, ``to_rgb1``, ``style_convs`` and ``to_rgbs``."""

    image_input = False  # style codes in, no image: not a network anysr infer can run
    num_style_feat: int
    log_size: int
    num_layers: int
    num_latent: int

    def init_schedule(self, out_size: int, num_style_feat: int) -> None:
        """Sizes and counts of ``out_size``, and the stored noise buffers (standard normal)."""
        self.num_style_feat = num_style_feat
        self.log_size = check_out_size(out_size, type(self).__name__)
        self.num_layers = (self.log_size - 2) * 2 + 1
        self.num_latent = self.log_size * 2 - 2
        self.noises = nn.Module()
        for idx in range(self.num_layers):
            side = 2 ** ((idx + 5) // 2)
            self.noises.register_buffer(f"noise{idx}", torch.randn(1, 1, side, side))

    def make_noise(self) -> list[torch.Tensor]:
        """Fresh noise maps, one per style conv (4x4, then two per resolution)."""
        device = self.constant_input.weight.device
        sides = [4] + [2**i for i in range(3, self.log_size + 1) for _ in range(2)]
        return [torch.randn(1, 1, s, s, device=device) for s in sides]

    def get_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Style codes -> latents (the mapping MLP)."""
        return self.style_mlp(x)

    def mean_latent(self, num_latent: int) -> torch.Tensor:
        """The mean latent of ``num_latent`` random codes (for truncation), (1, num_style_feat)."""
        codes = torch.randn(num_latent, self.num_style_feat, device=self.constant_input.weight.device)
        return self.style_mlp(codes).mean(0, keepdim=True)

    def layer_noise(self, noise: Sequence[torch.Tensor | None] | None, randomize_noise: bool
                    ) -> list[torch.Tensor | None]:
        """The noise per style conv: given, stored (``randomize_noise=False``) or None (fresh each call)."""
        if noise is not None:
            return list(noise)
        if randomize_noise:
            return [None] * self.num_layers
        return [getattr(self.noises, f"noise{i}") for i in range(self.num_layers)]

    def latents(self, styles: Sequence[torch.Tensor] | torch.Tensor, input_is_latent: bool, truncation: float,
                truncation_latent: torch.Tensor | None, inject_index: int | None) -> torch.Tensor:
        """(b, num_latent, num_style_feat) latents from style codes (mapping MLP unless ``input_is_latent``)."""
        styles = [styles] if isinstance(styles, torch.Tensor) else list(styles)
        if not input_is_latent:
            styles = [self.style_mlp(s) for s in styles]
        return mix_latents(truncate(styles, truncation, truncation_latent), self.num_latent, inject_index)

    def synthesize(self, latent: torch.Tensor, noise: list[torch.Tensor | None],
                   conditions: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """The synthesis network on per-layer latents; ``conditions`` (scale, shift per level) for SFT."""
        out = self.style_conv1(self.constant_input(latent.shape[0]), latent[:, 0], noise=noise[0])
        skip = self.to_rgb1(out, latent[:, 1])
        for level, to_rgb in enumerate(self.to_rgbs):
            i = 2 * level + 1
            out = self.style_convs[2 * level](out, latent[:, i], noise=noise[i])
            if conditions is not None and i < len(conditions):
                out = self.apply_sft(out, conditions[i - 1], conditions[i])
            out = self.style_convs[2 * level + 1](out, latent[:, i + 1], noise=noise[i + 1])
            skip = to_rgb(out, latent[:, i + 2], skip)
        return skip

    def apply_sft(self, out: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """Spatial feature transform (used by GFPGAN's decoder): ``out * scale + shift``."""
        return out * scale + shift

    def forward(self, styles: Sequence[torch.Tensor] | torch.Tensor, input_is_latent: bool = False,
                noise: Sequence[torch.Tensor | None] | None = None, randomize_noise: bool = True,
                truncation: float = 1, truncation_latent: torch.Tensor | None = None,
                inject_index: int | torch.Tensor | None = None, return_latents: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(image, latents or None) from a list of one or two style codes (b, num_style_feat) (or a tensor)."""
        latent = self.latents(styles, input_is_latent, truncation, truncation_latent, inject_index)
        image = self.synthesize(latent, self.layer_noise(noise, randomize_noise))
        return image, (latent if return_latents else None)


@ARCH_REGISTRY.register()
class StyleGAN2Generator(StyleGeneratorBase):
    """StyleGAN2's generator as in BasicSR 1.4.2 (equalised-lr layers, FIR up-sampling).

    Args:
        out_size: output side, a power of two (BasicSR's FFHQ models: 1024; GFPGAN's decoder: 512).
        num_style_feat: width of style codes and latents. num_mlp: layers of the mapping MLP.
        channel_multiplier: width factor from 64 pixels up. resample_kernel: 1-D FIR taps.
        lr_mlp: learning-rate multiplier of the mapping MLP. narrow: width factor of every layer.
    """

    def __init__(self, out_size: int, num_style_feat: int = 512, num_mlp: int = 8, channel_multiplier: int = 2,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1), lr_mlp: float = 0.01, narrow: float = 1) -> None:
        super().__init__()
        check_out_size(out_size, "StyleGAN2Generator")
        self.style_mlp = nn.Sequential(NormStyleCode(), *(
            EqualLinear(num_style_feat, num_style_feat, bias=True, lr_mul=lr_mlp, activation="fused_lrelu")
            for _ in range(num_mlp)))
        self.channels = channels = stylegan_channels(channel_multiplier, narrow)
        rk = tuple(resample_kernel)
        self.constant_input = ConstantInput(channels["4"], size=4)
        self.style_conv1 = StyleConv(channels["4"], channels["4"], 3, num_style_feat, resample_kernel=rk)
        self.to_rgb1 = ToRGB(channels["4"], num_style_feat, upsample=False, resample_kernel=rk)
        self.init_schedule(out_size, num_style_feat)
        self.style_convs = nn.ModuleList()
        self.to_rgbs = nn.ModuleList()
        in_ch = channels["4"]
        for i in range(3, self.log_size + 1):
            out_ch = channels[str(2**i)]
            self.style_convs.append(StyleConv(in_ch, out_ch, 3, num_style_feat, sample_mode="upsample",
                                              resample_kernel=rk))
            self.style_convs.append(StyleConv(out_ch, out_ch, 3, num_style_feat, resample_kernel=rk))
            self.to_rgbs.append(ToRGB(out_ch, num_style_feat, upsample=True, resample_kernel=rk))
            in_ch = out_ch


# ------------------------------------------------------------------------------------------- discriminator

class ConvLayer(nn.Sequential):
    """EqualConv2d (after an FIR blur when ``downsample``, then stride 2), with a fused bias + leaky ReLU
    (``activate`` and ``bias``), a scaled leaky ReLU (``activate`` only) or nothing."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, downsample: bool = False,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1), bias: bool = True, activate: bool = True) -> None:
        layers: list[nn.Module] = []
        if downsample:
            layers.append(fir_smooth(resample_kernel, kernel_size, down=2))
        stride, padding = (2, 0) if downsample else (1, kernel_size // 2)
        layers.append(EqualConv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                  bias=bias and not activate))
        if activate:
            layers.append(FusedLeakyReLU(out_channels) if bias else ScaledLeakyReLU(0.2))
        super().__init__(*layers)
        self.padding = padding


class ResBlock(nn.Module):
    """Residual block halving the size: conv 3x3, blur + stride-2 conv 3x3, 1x1 blurred skip; sum / sqrt(2)."""

    def __init__(self, in_channels: int, out_channels: int, resample_kernel: Sequence[float] = (1, 3, 3, 1)) -> None:
        super().__init__()
        self.conv1 = ConvLayer(in_channels, in_channels, 3)
        self.conv2 = ConvLayer(in_channels, out_channels, 3, downsample=True, resample_kernel=resample_kernel)
        self.skip = ConvLayer(in_channels, out_channels, 1, downsample=True, resample_kernel=resample_kernel,
                              bias=False, activate=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv2(self.conv1(x)) + self.skip(x)) / SQRT2


@ARCH_REGISTRY.register()
class StyleGAN2Discriminator(nn.Module):
    """StyleGAN2's residual discriminator as in BasicSR 1.4.2: (b, 3, out_size, out_size) -> (b, 1) scores.

    Args:
        out_size: input side, a power of two. channel_multiplier: width factor from 64 pixels up.
        resample_kernel: 1-D FIR taps of the blurs. stddev_group: samples per minibatch-stddev group (a batch
        must be a multiple of it, or smaller). narrow: width factor of every layer.
    """

    def __init__(self, out_size: int, channel_multiplier: int = 2, resample_kernel: Sequence[float] = (1, 3, 3, 1),
                 stddev_group: int = 4, narrow: float = 1) -> None:
        super().__init__()
        log_size = check_out_size(out_size, "StyleGAN2Discriminator")
        if isinstance(stddev_group, bool) or not isinstance(stddev_group, int) or stddev_group < 1:
            raise ArchArgumentError("stddev_group", f"StyleGAN2Discriminator needs an integer stddev_group >= 1, "
                                    f"got {stddev_group!r}")
        channels = stylegan_channels(channel_multiplier, narrow)
        rk = tuple(resample_kernel)
        body: list[nn.Module] = [ConvLayer(3, channels[str(out_size)], 1)]
        in_ch = channels[str(out_size)]
        for i in range(log_size, 2, -1):
            out_ch = channels[str(2 ** (i - 1))]
            body.append(ResBlock(in_ch, out_ch, rk))
            in_ch = out_ch
        self.conv_body = nn.Sequential(*body)
        self.final_conv = ConvLayer(in_ch + 1, channels["4"], 3)
        self.final_linear = nn.Sequential(
            EqualLinear(channels["4"] * 16, channels["4"], activation="fused_lrelu"),
            EqualLinear(channels["4"], 1),
        )
        self.out_size = out_size
        self.stddev_group = stddev_group
        self.stddev_feat = 1

    def minibatch_stddev(self, out: torch.Tensor) -> torch.Tensor:
        """Append the mean (over features and pixels) standard deviation across each group of samples."""
        b, c, h, w = out.shape
        group = min(b, self.stddev_group)
        if b % group:
            raise ValueError(f"StyleGAN2Discriminator: batch {b} is not a multiple of stddev_group {group}")
        grouped = out.view(group, -1, self.stddev_feat, c // self.stddev_feat, h, w)
        std = torch.sqrt(grouped.var(0, unbiased=False) + 1e-8).mean((2, 3, 4))  # (b / group, feat)
        std = std[:, :, None, None].expand(-1, -1, h, w).repeat(group, 1, 1, 1)
        return torch.cat([out, std.to(out.dtype)], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.out_size, self.out_size):
            raise ValueError(f"StyleGAN2Discriminator(out_size={self.out_size}) takes {self.out_size}x"
                             f"{self.out_size} images, got {tuple(x.shape[-2:])}")
        out = self.final_conv(self.minibatch_stddev(self.conv_body(x)))
        return self.final_linear(out.flatten(1))


__all__ = [
    "ConstantInput",
    "EqualConv2d",
    "EqualLinear",
    "FusedLeakyReLU",
    "ModulatedConv2d",
    "StyleConv",
    "StyleGAN2Discriminator",
    "StyleGAN2Generator",
    "StyleGeneratorBase",
    "ToRGB",
    "check_out_size",
    "mix_latents",
    "modulated_conv",
    "stylegan_channels",
    "upfirdn2d",
]


def synthesis_arguments(s: StateShapes) -> list[dict]:
    """The synthesis layers' arguments of a StyleGAN2 generator from its tensors: ``out_size`` from the ToRGB
    count, ``num_style_feat`` from the first modulation, ``narrow`` from the 4-pixel width (512 * narrow) and
    ``channel_multiplier`` from the 64-pixel one (256 * multiplier * narrow; below 64 pixels it shows in no
    tensor: 2 is proposed)."""
    log_size = s.count("to_rgbs.") + 2
    c4 = s.dim("constant_input.weight", 1)
    common = {"out_size": 2**log_size, "num_style_feat": s.dim("style_conv1.modulated_conv.modulation.weight", 1),
              "narrow": width_ratio(c4, 512, 1)}
    if log_size < 6:
        return [{**common, "channel_multiplier": 2}]
    c64 = s.dim("to_rgbs.3.modulated_conv.weight", 2)
    guess = round(c64 / (256 * common["narrow"]))
    return [{**common, "channel_multiplier": m} for m in dict.fromkeys((guess, guess + 1, max(guess - 1, 1)))
            if int(256 * m * common["narrow"]) == c64]


def _recognise(s: StateShapes) -> list[dict]:
    """StyleGAN2Generator from its tensors: the synthesis layers (``synthesis_arguments``) and the mapping MLP's
    depth (its EqualLinear layers follow one another: ``style_mlp.1`` ... ``style_mlp.<num_mlp>``)."""
    mlp = s.indices("style_mlp.")
    if mlp != list(range(1, len(mlp) + 1)):
        return []
    return [{**p, "num_mlp": len(mlp)} for p in synthesis_arguments(s)]


register_recogniser("StyleGAN2Generator", _recognise)
