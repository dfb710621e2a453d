"""GFPGAN v1 (the network GFPGAN's authors train) and its facial-component discriminator.

"Towards Real-World Blind Face Restoration with Generative Facial Prior" (Wang, Li, Zhang, Shan; CVPR 2021).
Module names and constructor arguments follow the authors' ``GFPGANv1`` and ``FacialComponentDiscriminator``
(``gfpgan/archs/gfpganv1_arch.py``, the networks of ``options/train_gfpgan_v1.yml``), so their checkpoints load
with ``strict=True`` and give the same outputs.

Unlike ``GFPGANv1Clean`` (anysr/archs/gfpgan_arch.py) every layer is StyleGAN2's: the U-Net is built of BasicSR's
equalised-lr ``ConvLayer`` / ``ResBlock`` (FIR-blurred downsampling) and bilinear-upsampling ``ResUpBlock`` s, and
the decoder is BasicSR's ``StyleGAN2Generator`` (equalised-lr mapping MLP, transposed-conv + FIR upsampling) with
SFT conditions (``StyleGAN2GeneratorSFT``). BasicSR's custom CUDA ops are computed in plain PyTorch
(anysr/archs/stylegan2_arch.py), so everything runs on any device.

Images are in [-1, 1]. ``GFPGANv1`` restores ``out_size`` x ``out_size`` faces (smaller ones are grown by reflect /
edge padding and the output cropped) and returns ``(image, U-Net RGB images per level)`` as the authors' forward
does (the RGB pyramid feeds their pyramid loss). ``FacialComponentDiscriminator`` scores eye / mouth crops (80 x 80
in GFPGAN's training) at a quarter of their size and can return two intermediate features (its style loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.discriminator_arch import upsample2x
from anysr.archs.gfpgan_arch import GFPGANFace, SFTGenerator
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.stylegan2_arch import (
    ConvLayer,
    EqualConv2d,
    EqualLinear,
    FusedLeakyReLU,
    ResBlock,
    ScaledLeakyReLU,
    StyleGAN2Generator,
    check_out_size,
    stylegan_channels,
    synthesis_arguments,
)
from anysr.registry import ARCH_REGISTRY

SQRT2 = math.sqrt(2.0)


class StyleGAN2GeneratorSFT(SFTGenerator, StyleGAN2Generator):
    """BasicSR's StyleGAN2 generator with SFT conditions (``SFTGenerator``): GFPGANv1's decoder. Arguments as
    ``StyleGAN2Generator``'s, plus ``sft_half`` (modulate only the second half of the channels)."""

    def __init__(self, out_size: int, num_style_feat: int = 512, num_mlp: int = 8, channel_multiplier: int = 2,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1), lr_mlp: float = 0.01, narrow: float = 1,
                 sft_half: bool = False) -> None:
        super().__init__(out_size, num_style_feat=num_style_feat, num_mlp=num_mlp,
                         channel_multiplier=channel_multiplier, resample_kernel=resample_kernel, lr_mlp=lr_mlp,
                         narrow=narrow)
        self.sft_half = sft_half


class ConvUpLayer(nn.Module):
    """Bilinear x2 upsampling, then an equalised-lr conv (``weight`` N(0, 1), scaled by ``1 / sqrt(in * k * k)``)
    followed by a fused bias + leaky ReLU (``activate`` and ``bias``: ``activation.bias``), a scaled leaky ReLU
    (``activate`` only) or a plain ``bias`` (``bias`` only)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True, bias_init_val: float = 0, activate: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding = stride, padding
        self.scale = 1 / math.sqrt(in_channels * kernel_size**2)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.full((out_channels,), float(bias_init_val))) if bias and not activate else None
        self.activation: nn.Module | None = None
        if activate:
            self.activation = FusedLeakyReLU(out_channels) if bias else ScaledLeakyReLU(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv2d(upsample2x(x), self.weight * self.scale, self.bias, stride=self.stride, padding=self.padding)
        return out if self.activation is None else self.activation(out)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, padding={self.padding}"


class ResUpBlock(nn.Module):
    """U-Net block doubling the size: conv 3x3, bilinear-up conv 3x3, plus a bilinear-up 1x1 skip; sum / sqrt(2)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = ConvLayer(in_channels, in_channels, 3)
        self.conv2 = ConvUpLayer(in_channels, out_channels, 3, padding=1)
        self.skip = ConvUpLayer(in_channels, out_channels, 1, bias=False, activate=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv2(self.conv1(x)) + self.skip(x)) / SQRT2


def sft_head(channels: int, out_channels: int, bias_init_val: float) -> nn.Sequential:
    """Equalised conv 3x3 - scaled leaky ReLU - equalised conv 3x3 (its bias starting at ``bias_init_val``: 1 for
    the scales, 0 for the shifts): one SFT condition map."""
    return nn.Sequential(EqualConv2d(channels, channels, 3, padding=1), ScaledLeakyReLU(0.2),
                         EqualConv2d(channels, out_channels, 3, padding=1, bias_init_val=bias_init_val))


@ARCH_REGISTRY.register()
class GFPGANv1(GFPGANFace, nn.Module):
    """GFPGAN v1 as trained by its authors: StyleGAN2-layer U-Net + SFT-conditioned StyleGAN2 decoder;
    (b, 3, s, s) -> ((b, 3, s, s), [U-Net RGB per level, 8 ... s pixels]), s = ``out_size``, images in [-1, 1].

    Args (the authors' defaults; ``out_size`` 512 here, required there; GFPGAN's training file sets
    ``channel_multiplier`` 1, ``input_is_latent``, ``different_w`` and ``sft_half``):
        out_size: face side (a power of two). num_style_feat: latent width. channel_multiplier: StyleGAN2 width
        factor. resample_kernel: 1-D FIR taps (U-Net downsampling and decoder). decoder_load_path: a pretrained
        StyleGAN2 file; kept as the attribute ``decoder_load_path`` for the training model to load into
        ``stylegan_decoder`` (architectures read no files). fix_decoder: freeze the decoder. num_mlp, lr_mlp:
        the decoder's mapping MLP (unused with ``input_is_latent``). input_is_latent: the encoder predicts latents
        directly. different_w: one latent per decoder layer. narrow: width factor (the U-Net uses half of it).
        sft_half: SFT on half of the decoder channels.
    """

    image_range = (-1.0, 1.0)  # the authors' images; anysr's pipeline feeds [0, 1] (arch_util.unit_range)

    def __init__(self, out_size: int = 512, num_style_feat: int = 512, channel_multiplier: int = 1,
                 resample_kernel: Sequence[float] = (1, 3, 3, 1), decoder_load_path: str | None = None,
                 fix_decoder: bool = True, num_mlp: int = 8, lr_mlp: float = 0.01, input_is_latent: bool = False,
                 different_w: bool = False, narrow: float = 1, sft_half: bool = False) -> None:
        super().__init__()
        self.log_size = check_out_size(out_size, "GFPGANv1")
        self.out_size = self.tile_multiple = out_size
        self.max_input_side = out_size  # larger faces are refused (fit_face)
        self.input_is_latent, self.different_w, self.num_style_feat = input_is_latent, different_w, num_style_feat
        self.decoder_load_path = decoder_load_path
        self.randomize_noise = True
        rk = tuple(resample_kernel)
        ch = stylegan_channels(channel_multiplier, narrow * 0.5)
        levels = range(3, self.log_size + 1)

        self.conv_body_first = ConvLayer(3, ch[str(out_size)], 1)
        self.conv_body_down = nn.ModuleList()
        in_ch = ch[str(out_size)]
        for i in range(self.log_size, 2, -1):
            self.conv_body_down.append(ResBlock(in_ch, ch[str(2 ** (i - 1))], rk))
            in_ch = ch[str(2 ** (i - 1))]
        self.final_conv = ConvLayer(in_ch, ch["4"], 3)
        self.conv_body_up = nn.ModuleList()
        in_ch = ch["4"]
        for i in levels:
            self.conv_body_up.append(ResUpBlock(in_ch, ch[str(2**i)]))
            in_ch = ch[str(2**i)]
        self.toRGB = nn.ModuleList(EqualConv2d(ch[str(2**i)], 3, 1) for i in levels)
        latents = (self.log_size * 2 - 2) if different_w else 1
        self.final_linear = EqualLinear(ch["4"] * 16, latents * num_style_feat)
        self.stylegan_decoder = StyleGAN2GeneratorSFT(out_size, num_style_feat=num_style_feat, num_mlp=num_mlp,
                                                      channel_multiplier=channel_multiplier, resample_kernel=rk,
                                                      lr_mlp=lr_mlp, narrow=narrow, sft_half=sft_half)
        if fix_decoder:
            self.stylegan_decoder.requires_grad_(False)
        sft_factor = 1 if sft_half else 2
        self.condition_scale = nn.ModuleList(sft_head(ch[str(2**i)], ch[str(2**i)] * sft_factor, 1) for i in levels)
        self.condition_shift = nn.ModuleList(sft_head(ch[str(2**i)], ch[str(2**i)] * sft_factor, 0) for i in levels)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_body_first(x)  # ConvLayer: the activation is inside

    def bottom(self, feat: torch.Tensor) -> torch.Tensor:
        return self.final_conv(feat)


@ARCH_REGISTRY.register()
class FacialComponentDiscriminator(nn.Module):
    """GFPGAN's eye / mouth discriminator (fixed VGG-style widths 64-128-256, two FIR-blurred stride-2 convs):
    (b, 3, h, w) -> ((b, 1, h / 4, w / 4) scores (sides rounded down), [the 128-channel half-size and
    256-channel quarter-size features] with ``return_feats``, else None)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvLayer(3, 64, 3)
        self.conv2 = ConvLayer(64, 128, 3, downsample=True)
        self.conv3 = ConvLayer(128, 128, 3)
        self.conv4 = ConvLayer(128, 256, 3, downsample=True)
        self.conv5 = ConvLayer(256, 256, 3)
        self.final_conv = ConvLayer(256, 1, 3, activate=False)

    def forward(self, x: torch.Tensor, return_feats: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        feat = self.conv3(self.conv2(self.conv1(x)))
        feats = [feat]
        feat = self.conv5(self.conv4(feat))
        feats.append(feat)
        return self.final_conv(feat), (feats if return_feats else None)


__all__ = ["ConvUpLayer", "FacialComponentDiscriminator", "GFPGANv1", "ResUpBlock", "StyleGAN2GeneratorSFT"]


def _recognise(s: StateShapes) -> list[dict]:
    """GFPGANv1 from its tensors: the decoder's synthesis layers (``synthesis_arguments`` on the
    ``stylegan_decoder.`` names; ``channel_multiplier`` shows from 64 pixels on, else the class's 1), its mapping
    depth (EqualLinear layers one after another), one latent per layer or one, SFT on half of the channels or all.
    ``input_is_latent`` shows in no tensor: True, as in the authors' training file (the released GFPGANv1 model)."""
    prefix = "stylegan_decoder."
    decoder = StateShapes({k[len(prefix):]: s.shape(k) for k in s.keys() if k.startswith(prefix)})
    mlp = decoder.indices("style_mlp.")
    if not mlp or mlp != list(range(1, len(mlp) + 1)):
        return []
    style = decoder.dim("style_mlp.1.weight", 0)
    common = {"num_mlp": len(mlp), "input_is_latent": True, "different_w": s.dim("final_linear.weight", 0) != style,
              "sft_half": s.dim("condition_scale.0.2.weight", 0) == s.dim("condition_scale.0.0.weight", 0)}
    out = []
    for p in synthesis_arguments(decoder):
        if p["out_size"] < 64:
            p = {**p, "channel_multiplier": 1}
        out.append({**p, **common})
    return out


register_recogniser("GFPGANv1", _recognise)


def _recognise_component(s: StateShapes) -> dict | None:
    """FacialComponentDiscriminator: no arguments (its widths are fixed); its own names say it."""
    return {} if "final_conv.0.weight" in s and "conv5.1.bias" in s else None


register_recogniser("FacialComponentDiscriminator", _recognise_component)
