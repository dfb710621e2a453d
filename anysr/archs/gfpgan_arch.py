"""GFPGAN (clean version): blind face restoration with a generative facial prior.

"Towards Real-World Blind Face Restoration with Generative Facial Prior" (Wang, Li, Zhang, Shan; CVPR 2021).
Module names and constructor arguments follow the authors' ``GFPGANv1Clean`` (as in spandrel 0.4.2), so the
released GFPGAN v1.3 / v1.4 checkpoints load with ``strict=True`` and give the same output.

A U-Net encodes the degraded face down to 4x4; a linear layer turns the bottleneck into StyleGAN2 latents (one
per layer with ``different_w``), and at every decoder level two small conv heads predict spatial feature
transform (scale, shift) maps. A StyleGAN2 generator (the "clean" variant: plain Linear modulation, bilinear
resampling, computed from slices so that XLA lowers its gradient too;
``StyleGAN2GeneratorClean``) synthesises the face from the latents, its features modulated by the
SFT maps (on half of the channels with ``sft_half``).

Images are in [-1, 1] (the authors normalise with mean 0.5, std 0.5). Size requirement: exactly
``out_size`` x ``out_size`` (512 for the released models); smaller inputs are grown by reflect / edge padding and
the output cropped, larger ones are an error. The decoder adds fresh noise at every style conv (the authors'
default, ``randomize_noise``); set ``randomize_noise = False`` on the network (or pass it to ``forward``) to use
the stored noise maps for a deterministic result.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, default_init_weights, pad_to_min_size, refuse_weights_path
from anysr.archs.discriminator_arch import upsample2x
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.stylegan2_arch import (
    ConstantInput,
    NormStyleCode,
    StyleGeneratorBase,
    check_out_size,
    modulated_conv,
    noise_like,
    stylegan_channels,
    synthesis_arguments,
)
from anysr.registry import ARCH_REGISTRY

SQRT2 = math.sqrt(2.0)


class ModulatedConv2d(nn.Module):
    """Modulated convolution without equalised lr: ``modulation`` is a plain Linear (bias initialised to 1) and
    ``weight`` (1, out, in, k, k) is stored pre-scaled. 'upsample' / 'downsample' resize bilinearly first."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_style_feat: int,
                 demodulate: bool = True, sample_mode: str | None = None, eps: float = 1e-8) -> None:
        super().__init__()
        if sample_mode not in ("upsample", "downsample", None):
            raise ArchArgumentError("sample_mode", f"ModulatedConv2d: sample_mode must be 'upsample', 'downsample' "
                                    f"or None, got {sample_mode!r}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.demodulate, self.sample_mode, self.eps = demodulate, sample_mode, eps
        self.modulation = nn.Linear(num_style_feat, in_channels, bias=True)
        default_init_weights(self.modulation, scale=1, bias_fill=1, a=0, mode="fan_in", nonlinearity="linear")
        self.weight = nn.Parameter(torch.randn(1, out_channels, in_channels, kernel_size, kernel_size)
                                   / math.sqrt(in_channels * kernel_size**2))
        self.padding = kernel_size // 2

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        if self.sample_mode == "upsample":
            x = upsample2x(x)
        elif self.sample_mode == "downsample":
            x = F.avg_pool2d(x, 2)  # bilinear x0.5 (align_corners=False) of an even size
        return modulated_conv(x, self.weight[0], self.modulation(style), self.demodulate, self.eps, None,
                              self.padding)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"demodulate={self.demodulate}, sample_mode={self.sample_mode}")


class StyleConv(nn.Module):
    """Modulated conv (times sqrt(2)), noise scaled by ``weight``, ``bias`` (1, C, 1, 1), leaky ReLU 0.2."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_style_feat: int,
                 demodulate: bool = True, sample_mode: str | None = None) -> None:
        super().__init__()
        self.modulated_conv = ModulatedConv2d(in_channels, out_channels, kernel_size, num_style_feat,
                                              demodulate=demodulate, sample_mode=sample_mode)
        self.weight = nn.Parameter(torch.zeros(1))  # noise strength
        self.bias = nn.Parameter(torch.zeros(1, out_channels, 1, 1))
        self.activate = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        out = self.modulated_conv(x, style) * SQRT2
        return self.activate(out + self.weight * noise_like(out, noise) + self.bias)


class ToRGB(nn.Module):
    """1x1 modulated conv to RGB plus ``bias``, added to the bilinearly upsampled previous RGB (``upsample``)."""

    def __init__(self, in_channels: int, num_style_feat: int, upsample: bool = True) -> None:
        super().__init__()
        self.upsample = upsample
        self.modulated_conv = ModulatedConv2d(in_channels, 3, 1, num_style_feat, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(self, x: torch.Tensor, style: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        out = self.modulated_conv(x, style) + self.bias
        if skip is None:
            return out
        if self.upsample:
            skip = upsample2x(skip)
        return out + skip


@ARCH_REGISTRY.register()
class StyleGAN2GeneratorClean(StyleGeneratorBase):
    """StyleGAN2's generator without custom ops (the decoder of GFPGANv1Clean); ``forward`` as BasicSR's
    ``StyleGAN2Generator`` (style codes -> (image, latents or None)).

    Args:
        out_size: output side, a power of two. num_style_feat: width of style codes / latents.
        num_mlp: layers of the mapping MLP. channel_multiplier: width factor from 64 pixels up.
        narrow: width factor of every layer.
    """

    def __init__(self, out_size: int, num_style_feat: int = 512, num_mlp: int = 8, channel_multiplier: int = 2,
                 narrow: float = 1) -> None:
        super().__init__()
        check_out_size(out_size, type(self).__name__)
        layers: list[nn.Module] = [NormStyleCode()]
        for _ in range(num_mlp):
            layers += [nn.Linear(num_style_feat, num_style_feat), nn.LeakyReLU(negative_slope=0.2)]
        self.style_mlp = nn.Sequential(*layers)
        default_init_weights(self.style_mlp, scale=1, bias_fill=0, a=0.2, mode="fan_in", nonlinearity="leaky_relu")
        self.channels = channels = stylegan_channels(channel_multiplier, narrow)
        self.constant_input = ConstantInput(channels["4"], size=4)
        self.style_conv1 = StyleConv(channels["4"], channels["4"], 3, num_style_feat)
        self.to_rgb1 = ToRGB(channels["4"], num_style_feat, upsample=False)
        self.init_schedule(out_size, num_style_feat)
        self.style_convs = nn.ModuleList()
        self.to_rgbs = nn.ModuleList()
        in_ch = channels["4"]
        for i in range(3, self.log_size + 1):
            out_ch = channels[str(2**i)]
            self.style_convs.append(StyleConv(in_ch, out_ch, 3, num_style_feat, sample_mode="upsample"))
            self.style_convs.append(StyleConv(out_ch, out_ch, 3, num_style_feat))
            self.to_rgbs.append(ToRGB(out_ch, num_style_feat, upsample=True))
            in_ch = out_ch


class SFTGenerator(StyleGeneratorBase):
    """What GFPGAN's two decoders share: their features after each upsampling conv are modulated by (scale, shift)
    condition maps (spatial feature transform; ``sft_half``: only the second half of the channels), and ``forward``
    takes the conditions after the style codes."""

    sft_half: bool = False

    def apply_sft(self, out: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        if not self.sft_half:
            return out * scale + shift
        half = out.shape[1] // 2
        return torch.cat([out[:, :half], out[:, half:] * scale + shift], 1)

    def forward(self, styles: list[torch.Tensor] | torch.Tensor, conditions: list[torch.Tensor],  # type: ignore[override]
                input_is_latent: bool = False, noise: list[torch.Tensor | None] | None = None,
                randomize_noise: bool = True, truncation: float = 1, truncation_latent: torch.Tensor | None = None,
                inject_index: int | None = None, return_latents: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        latent = self.latents(styles, input_is_latent, truncation, truncation_latent, inject_index)
        image = self.synthesize(latent, self.layer_noise(noise, randomize_noise), conditions)
        return image, (latent if return_latents else None)


class StyleGAN2GeneratorCSFT(SFTGenerator, StyleGAN2GeneratorClean):
    """The clean generator with SFT conditions (``SFTGenerator``): GFPGANv1Clean's decoder."""

    def __init__(self, out_size: int, num_style_feat: int = 512, num_mlp: int = 8, channel_multiplier: int = 2,
                 narrow: float = 1, sft_half: bool = False) -> None:
        super().__init__(out_size, num_style_feat=num_style_feat, num_mlp=num_mlp,
                         channel_multiplier=channel_multiplier, narrow=narrow)
        self.sft_half = sft_half


class ResBlock(nn.Module):
    """U-Net block resizing by 2 (``mode`` 'down' / 'up', bilinear): conv-lrelu, resize, conv-lrelu, plus a
    resized 1x1-conv skip."""

    def __init__(self, in_channels: int, out_channels: int, mode: str = "down") -> None:
        super().__init__()
        if mode not in ("down", "up"):
            raise ArchArgumentError("mode", f"ResBlock: mode must be 'down' or 'up', got {mode!r}")
        self.conv1 = nn.Conv2d(in_channels, in_channels, 3, 1, 1)
        self.conv2 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.mode = mode
        self.scale_factor = 0.5 if mode == "down" else 2

    def resize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "down":
            return F.avg_pool2d(x, 2)  # = bilinear x0.5 without align_corners on even sizes
        return upsample2x(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.leaky_relu(self.conv1(x), 0.2)
        out = F.leaky_relu(self.conv2(self.resize(out)), 0.2)
        return out + self.skip(self.resize(x))


def fit_face(x: torch.Tensor, out_size: int, owner: str) -> torch.Tensor:
    """``x`` grown to ``out_size`` x ``out_size`` (bottom / right, as ``pad_to_min_size``); ValueError when a side is
    larger (the U-Net's bottleneck is a fixed 4x4)."""
    h, w = x.shape[-2:]
    if h > out_size or w > out_size:
        raise ValueError(f"{owner}(out_size={out_size}) restores {out_size}x{out_size} faces, got {h}x{w}: resize "
                         "or crop the face first")
    return pad_to_min_size(x, out_size)


def sft_head(channels: int, out_channels: int) -> nn.Sequential:
    """conv 3x3 - leaky ReLU 0.2 - conv 3x3: one SFT condition map (scale or shift)."""
    return nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1), nn.LeakyReLU(0.2),
                         nn.Conv2d(channels, out_channels, 3, 1, 1))


class GFPGANFace:
    """What GFPGAN's two variants (``GFPGANv1Clean``, ``GFPGANv1``) share: the U-Net pass and the forward. A variant
    (listed before ``nn.Module``) builds the same module names and gives ``stem`` (the first conv and its
    activation) and ``bottom`` (the 4x4 conv and its activation)."""

    out_size: int
    num_style_feat: int
    different_w: bool
    input_is_latent: bool
    randomize_noise: bool

    def encode(self, x: torch.Tensor, with_rgb: bool = True) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                    list[torch.Tensor]]:
        """The U-Net: (style code, SFT conditions [scale, shift per level], RGB image per level if ``with_rgb``)."""
        feat = self.stem(x)  # type: ignore[attr-defined]
        skips = []
        for down in self.conv_body_down:  # type: ignore[attr-defined]
            feat = down(feat)
            skips.append(feat)
        feat = self.bottom(feat)  # type: ignore[attr-defined]
        style = self.final_linear(feat.flatten(1))  # type: ignore[attr-defined]
        if self.different_w:
            style = style.view(style.shape[0], -1, self.num_style_feat)
        conditions, rgbs = [], []
        for i, up in enumerate(self.conv_body_up):  # type: ignore[attr-defined]
            feat = up(feat + skips[-1 - i])
            conditions += [self.condition_scale[i](feat), self.condition_shift[i](feat)]  # type: ignore[attr-defined]
            if with_rgb:
                rgbs.append(self.toRGB[i](feat))  # type: ignore[attr-defined]
        return style, conditions, rgbs

    def forward(self, x: torch.Tensor, return_latents: bool = False, return_rgb: bool = False,
                randomize_noise: bool | None = None) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """The restored face, like every anysr network (inference, export); with ``return_rgb`` also the U-Net's RGB
        image per level (the authors' tuple, for their pyramid loss; their forward always returns the tuple).
        ``randomize_noise`` None: the network's ``randomize_noise`` attribute (True: fresh noise, as the authors'
        default). ``return_latents`` is accepted for the authors' signature and, as there, changes nothing."""
        h, w = x.shape[-2:]
        x = fit_face(x, self.out_size, type(self).__name__)
        style, conditions, rgbs = self.encode(x, with_rgb=return_rgb)
        noise = self.randomize_noise if randomize_noise is None else randomize_noise
        image, _ = self.stylegan_decoder([style], conditions,  # type: ignore[attr-defined]
                                         input_is_latent=self.input_is_latent, randomize_noise=noise)
        image = image[..., :h, :w]
        return (image, rgbs) if return_rgb else image


@ARCH_REGISTRY.register()
class GFPGANv1Clean(GFPGANFace, nn.Module):
    """GFPGAN v1 (clean): U-Net encoder + SFT-conditioned StyleGAN2 decoder; (b, 3, s, s) -> (b, 3, s, s),
    s = ``out_size``, images in [-1, 1].

    Args (keyword-only, defaults of the released v1.3 / v1.4 models):
        out_size: face side (a power of two). num_style_feat: latent width. channel_multiplier: StyleGAN2 width
        factor. decoder_load_path: must be None (weights are loaded by the engine). fix_decoder: freeze the
        StyleGAN2 decoder. num_mlp: mapping-MLP layers (unused when ``input_is_latent``). input_is_latent: the
        encoder predicts latents directly. different_w: one latent per decoder layer. narrow: width factor
        (the U-Net uses half of it). sft_half: SFT on half of the decoder channels.
    """

    image_range = (-1.0, 1.0)  # the authors' images; anysr's pipeline feeds [0, 1] (arch_util.unit_range)

    def __init__(self, *, out_size: int = 512, num_style_feat: int = 512, channel_multiplier: int = 2,
                 decoder_load_path: str | None = None, fix_decoder: bool = False, num_mlp: int = 8,
                 input_is_latent: bool = True, different_w: bool = True, narrow: float = 1,
                 sft_half: bool = True) -> None:
        super().__init__()
        refuse_weights_path("decoder_load_path", decoder_load_path, "StyleGAN2 decoder")
        self.log_size = check_out_size(out_size, "GFPGANv1Clean")
        self.out_size = out_size
        self.tile_multiple = out_size
        self.max_input_side = out_size  # larger faces are refused (fit_face)
        self.different_w, self.input_is_latent, self.num_style_feat = different_w, input_is_latent, num_style_feat
        self.randomize_noise = True
        ch = stylegan_channels(channel_multiplier, narrow * 0.5)
        levels = range(3, self.log_size + 1)

        self.conv_body_first = nn.Conv2d(3, ch[str(out_size)], 1)
        self.conv_body_down = nn.ModuleList()
        in_ch = ch[str(out_size)]
        for i in range(self.log_size, 2, -1):
            self.conv_body_down.append(ResBlock(in_ch, ch[str(2 ** (i - 1))], mode="down"))
            in_ch = ch[str(2 ** (i - 1))]
        self.final_conv = nn.Conv2d(in_ch, ch["4"], 3, 1, 1)
        self.conv_body_up = nn.ModuleList()
        in_ch = ch["4"]
        for i in levels:
            self.conv_body_up.append(ResBlock(in_ch, ch[str(2**i)], mode="up"))
            in_ch = ch[str(2**i)]
        self.toRGB = nn.ModuleList(nn.Conv2d(ch[str(2**i)], 3, 1) for i in levels)
        latents = (self.log_size * 2 - 2) if different_w else 1
        self.final_linear = nn.Linear(ch["4"] * 16, latents * num_style_feat)
        self.stylegan_decoder = StyleGAN2GeneratorCSFT(out_size, num_style_feat=num_style_feat, num_mlp=num_mlp,
                                                       channel_multiplier=channel_multiplier, narrow=narrow,
                                                       sft_half=sft_half)
        if fix_decoder:
            self.stylegan_decoder.requires_grad_(False)
        sft_factor = 1 if sft_half else 2
        self.condition_scale = nn.ModuleList(sft_head(ch[str(2**i)], ch[str(2**i)] * sft_factor) for i in levels)
        self.condition_shift = nn.ModuleList(sft_head(ch[str(2**i)], ch[str(2**i)] * sft_factor) for i in levels)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.conv_body_first(x), 0.2)

    def bottom(self, feat: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.final_conv(feat), 0.2)


__all__ = ["GFPGANFace", "GFPGANv1Clean", "SFTGenerator", "StyleGAN2GeneratorCSFT", "StyleGAN2GeneratorClean",
           "fit_face"]


def _recognise(s: StateShapes) -> list[dict]:
    """GFPGAN v1 (clean) from its tensors: the output size from the levels, the style width and mapping depth, the
    width factors from the decoder (``narrow`` at 4 pixels, ``channel_multiplier`` at 64), one latent per layer or
    one, SFT on half of the channels or all. ``input_is_latent`` and ``fix_decoder`` change no tensor."""
    levels = s.count("toRGB.")
    log_size = levels + 2
    style = s.dim("stylegan_decoder.style_mlp.1.weight", 0)
    narrow = s.dim("stylegan_decoder.constant_input.weight", 1) / 512
    multipliers = [2, 1]
    if log_size >= 6:
        multipliers = [s.dim(f"stylegan_decoder.style_convs.{(6 - 3) * 2}.modulated_conv.weight", 1) / (256 * narrow)]
    last = s.count("condition_scale.0.") and max(s.indices("condition_scale.0."))
    common = {"out_size": 2**log_size, "num_style_feat": style, "num_mlp": s.count("stylegan_decoder.style_mlp."),
              "narrow": int(narrow) if narrow == int(narrow) else narrow,
              "different_w": s.dim("final_linear.weight", 0) != style,
              "sft_half": s.dim(f"condition_scale.0.{last}.weight", 0) == s.dim("condition_scale.0.0.weight", 0)}
    return [{"channel_multiplier": int(m) if m == int(m) else m, **common} for m in multipliers]


register_recogniser("GFPGANv1Clean", _recognise)


def _recognise_clean(s: StateShapes) -> list[dict]:
    """StyleGAN2GeneratorClean from its tensors: the synthesis layers (``synthesis_arguments``) and the mapping
    MLP's depth (Linear layers with a LeakyReLU between: ``style_mlp.1``, ``.3``, ...); its style convs' biases
    tell it from StyleGAN2Generator (whose one-layer MLP has the same names)."""
    mlp = s.indices("style_mlp.")
    if mlp != list(range(1, 2 * len(mlp), 2)):
        return []
    return [{**p, "num_mlp": len(mlp)} for p in synthesis_arguments(s)]


register_recogniser("StyleGAN2GeneratorClean", _recognise_clean)
