"""FFTformer: "Efficient Frequency Domain-based Transformers for High-Quality Image Deblurring" (Kong, Dong, Ge, Li,
Pan; CVPR 2023).

Module names and constructor arguments follow the authors' code (as in spandrel 0.4.2), so released checkpoints
load with ``strict=True`` and give the same output.

A three-level U-Net of transformer blocks (Restormer layout). The feed-forward network (DFFN) filters every 8x8
patch in the frequency domain with a learnt real weight per channel and frequency; the decoder blocks add a
frequency-domain self-attention (FSAS): the product of the queries' and keys' patch spectra (a circular
correlation per 8x8 patch), back to pixels, layer-normed and gating the values. Scale 1, any channel count.
Size requirement: 8x8 patches at quarter resolution, so inputs are padded (reflect, then edge) at the bottom /
right to a multiple of 32 inside ``forward`` (spandrel's size requirement) and the output cropped;
``tile_multiple`` is 32.

The 8x8 ``rfft2`` / ``irfft2`` pairs are computed as real matrix products with the exact 2-D DFT bases (64 pixels
<-> 40 complex coefficients, the imaginary parts of the DC and Nyquist columns dropped by the inverse, as a real
inverse FFT does), in float32 like the authors' ``.float()``: the same values within float rounding, and plain
matmuls for XLA, ONNX and autocast (no complex tensors, no FFT kernels).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.resize_util import resize_bilinear
from anysr.registry import ARCH_REGISTRY

PATCH = 8
SIZE_MULTIPLE = PATCH * 4  # two halvings
N_FREQ = PATCH * (PATCH // 2 + 1)  # 40 coefficients of a real 8x8 patch


def _float32_math(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast off (the DFT runs in float32 as the authors' FFT does) where autocast exists."""
    if torch.amp.is_autocast_available(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def unit_circle(k: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` / ``sin`` of ``2 pi k / n`` (float32) for integer ``k``: reduced modulo ``n`` first, so large
    products stay exact, with exact zeros at quarter turns."""
    angle = (k % n).float() * (2 * math.pi / n)
    cos, sin = angle.cos(), angle.sin()
    return torch.where(cos.abs() < 1e-6, 0.0, cos), torch.where(sin.abs() < 1e-6, 0.0, sin)


def dft_bases(device: torch.device, size: int = PATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """The real 2-D DFT of a ``size`` x ``size`` patch as matrices (float32, on ``device``; 8 by default).

    ``forward`` (s*s, 2 * s * (s // 2 + 1)): pixels (row-major) -> spectrum ``[real (s x f), imag (s x f)]``
    (``torch.fft.rfft2``); ``inverse``: spectrum -> pixels (``torch.fft.irfft2(., s=(s, s))``: the columns
    between DC and Nyquist count twice, the imaginary parts of the DC and (even ``s``) Nyquist columns contribute
    nothing).
    """
    n_freq = size * (size // 2 + 1)
    i = torch.arange(size, device=device)
    m, n = i.view(-1, 1, 1, 1), i.view(1, -1, 1, 1)
    u, v = i.view(1, 1, -1, 1), i[: size // 2 + 1].view(1, 1, 1, -1)
    cos, sin = unit_circle(u * m + v * n, size)
    weight = torch.where((v == 0) | (2 * v == size), 1.0, 2.0) / (size * size)
    forward = torch.cat([cos.reshape(size * size, n_freq), -sin.reshape(size * size, n_freq)], 1)
    inverse = torch.cat([(cos * weight).reshape(size * size, n_freq).t(),
                         (-sin * weight).reshape(size * size, n_freq).t()], 0)
    return forward, inverse


def to_patches(x: torch.Tensor, size: int = PATCH) -> torch.Tensor:
    """(b, c, h, w) -> (b, c, h / s, w / s, s * s) float32 (sizes left symbolic, for a dynamic ONNX graph)."""
    return x.float().unflatten(3, (-1, size)).unflatten(2, (-1, size)).transpose(3, 4).flatten(-2)


def from_patches(p: torch.Tensor, size: int = PATCH) -> torch.Tensor:
    """Inverse of ``to_patches``."""
    return p.unflatten(-1, (size, size)).transpose(3, 4).flatten(4, 5).flatten(2, 3)


class LayerNorm(nn.Module):
    """Channel layer norm of an NCHW map (eps 1e-5; the authors' 'WithBias' norm, parameters under ``body``)."""

    def __init__(self, dim: int, LayerNorm_type: str = "WithBias") -> None:  # noqa: N803 (the authors' name)
        super().__init__()
        if LayerNorm_type != "WithBias":
            raise ArchArgumentError("LayerNorm_type", "FFTformer uses the 'WithBias' layer norm only")
        self.body = LayerNorm2d(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class DFFN(nn.Module):
    """Frequency-domain feed-forward: 1x1 conv to 2 x hidden, per-patch spectral filter ``fft`` (one real weight
    per channel and frequency), 3x3 depth-wise conv, GELU gate, 1x1 conv back."""

    def __init__(self, dim: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__()
        hidden = int(dim * ffn_expansion_factor)
        self.patch_size = PATCH
        self.project_in = nn.Conv2d(dim, hidden * 2, 1, bias=bias)
        self.dwconv = nn.Conv2d(hidden * 2, hidden * 2, 3, 1, 1, groups=hidden * 2, bias=bias)
        self.fft = nn.Parameter(torch.ones(hidden * 2, 1, 1, PATCH, PATCH // 2 + 1))
        self.project_out = nn.Conv2d(hidden, dim, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.project_in(x)
        with _float32_math(x):
            fwd, inv = dft_bases(x.device)
            spec = (to_patches(x) @ fwd).unflatten(-1, (2, N_FREQ))
            spec = spec * self.fft.float().reshape(-1, 1, 1, 1, N_FREQ)
            filtered = from_patches(spec.flatten(-2) @ inv).to(x.dtype)
        x1, x2 = self.dwconv(filtered).chunk(2, dim=1)
        return self.project_out(F.gelu(x1) * x2)


class FSAS(nn.Module):
    """Frequency-domain self-attention: queries / keys / values from 1x1 + 3x3 depth-wise convs; per 8x8 patch the
    product of the query and key spectra back in pixels (circular correlation), layer-normed, gates the values."""

    def __init__(self, dim: int, bias: bool) -> None:
        super().__init__()
        self.to_hidden = nn.Conv2d(dim, dim * 6, 1, bias=bias)
        self.to_hidden_dw = nn.Conv2d(dim * 6, dim * 6, 3, 1, 1, groups=dim * 6, bias=bias)
        self.project_out = nn.Conv2d(dim * 2, dim, 1, bias=bias)
        self.norm = LayerNorm(dim * 2)
        self.patch_size = PATCH

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.to_hidden_dw(self.to_hidden(x)).chunk(3, dim=1)
        with _float32_math(q):
            fwd, inv = dft_bases(q.device)
            qr, qi = (to_patches(q) @ fwd).unflatten(-1, (2, N_FREQ)).unbind(-2)
            kr, ki = (to_patches(k) @ fwd).unflatten(-1, (2, N_FREQ)).unbind(-2)
            prod = torch.cat([qr * kr - qi * ki, qr * ki + qi * kr], -1)
            corr = self.norm(from_patches(prod @ inv))
            gated = (v * corr).to(v.dtype)
        return self.project_out(gated)


class TransformerBlock(nn.Module):
    """``x + FSAS(norm1 x)`` (when ``att``), then ``x + DFFN(norm2 x)``."""

    def __init__(self, dim: int, ffn_expansion_factor: float = 2.66, bias: bool = False,
                 LayerNorm_type: str = "WithBias", att: bool = False) -> None:  # noqa: N803 (the authors' name)
        super().__init__()
        self.att = att
        if att:
            self.norm1 = LayerNorm(dim, LayerNorm_type)
            self.attn = FSAS(dim, bias)
        self.norm2 = LayerNorm(dim, LayerNorm_type)
        self.ffn = DFFN(dim, ffn_expansion_factor, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.att:
            x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Fuse(nn.Module):
    """Decoder / encoder fusion: 1x1 conv of the concatenation, a transformer block, 1x1 conv, sum of halves."""

    def __init__(self, n_feat: int) -> None:
        super().__init__()
        self.n_feat = n_feat
        self.att_channel = TransformerBlock(n_feat * 2)
        self.conv = nn.Conv2d(n_feat * 2, n_feat * 2, 1)
        self.conv2 = nn.Conv2d(n_feat * 2, n_feat * 2, 1)

    def forward(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        e, d = self.conv2(self.att_channel(self.conv(torch.cat([enc, dec], 1)))).chunk(2, dim=1)
        return e + d


class OverlapPatchEmbed(nn.Module):
    """3x3 conv stem."""

    def __init__(self, in_c: int = 3, embed_dim: int = 48, bias: bool = False) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_c, embed_dim, 3, 1, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class HalfSize(nn.Module):
    """Bilinear halving (``align_corners=False``) of an even-sized map: exactly the mean of each 2x2 block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, 2)


class DoubleSize(nn.Module):
    """Bilinear doubling, ``align_corners=False`` (gathers on XLA: ``resize_bilinear``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        return resize_bilinear(x, (2 * h, 2 * w), align_corners=False)


class Downsample(nn.Module):
    """Bilinear halving, then a 3x3 conv doubling the width."""

    def __init__(self, n_feat: int) -> None:
        super().__init__()
        self.body = nn.Sequential(HalfSize(), nn.Conv2d(n_feat, n_feat * 2, 3, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Upsample(nn.Module):
    """Bilinear doubling, then a 3x3 conv halving the width."""

    def __init__(self, n_feat: int) -> None:
        super().__init__()
        self.body = nn.Sequential(DoubleSize(), nn.Conv2d(n_feat, n_feat // 2, 3, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@ARCH_REGISTRY.register()
class FFTformer(nn.Module):
    """FFTformer (x1): output = network(x) + x.

    Args:
        inp_channels / out_channels: image channels (equal: the input is added to the output).
        dim: width of level 1 (48 in the released GoPro / RealBlur models; levels 2 and 3 have 2x and 4x).
        num_blocks: blocks per encoder level (the decoder mirrors them, with FSAS). num_refinement_blocks: blocks
            after the decoder. ffn_expansion_factor: DFFN hidden width factor. bias: biases in the block convs.
    """

    tile_multiple: int = SIZE_MULTIPLE

    def __init__(self, *, inp_channels: int = 3, out_channels: int = 3, dim: int = 48,
                 num_blocks: Sequence[int] = (6, 6, 12), num_refinement_blocks: int = 4,
                 ffn_expansion_factor: float = 3, bias: bool = False) -> None:
        super().__init__()
        if inp_channels != out_channels:
            raise ArchArgumentError("out_channels", f"FFTformer adds its input to its output: out_channels must "
                                    f"equal inp_channels ({inp_channels}), got {out_channels}")
        if len(num_blocks) != 3:
            raise ArchArgumentError("num_blocks", f"FFTformer needs 3 block counts, got {num_blocks!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ArchArgumentError("dim", f"FFTformer needs a positive integer dim, got {dim!r}")

        def blocks(width: int, n: int, att: bool) -> nn.Sequential:
            return nn.Sequential(*(TransformerBlock(width, ffn_expansion_factor, bias, att=att) for _ in range(n)))

        self.patch_embed = OverlapPatchEmbed(inp_channels, dim)
        self.encoder_level1 = blocks(dim, num_blocks[0], False)
        self.down1_2 = Downsample(dim)
        self.encoder_level2 = blocks(dim * 2, num_blocks[1], False)
        self.down2_3 = Downsample(dim * 2)
        self.encoder_level3 = blocks(dim * 4, num_blocks[2], False)
        self.decoder_level3 = blocks(dim * 4, num_blocks[2], True)
        self.up3_2 = Upsample(dim * 4)
        self.reduce_chan_level2 = nn.Conv2d(dim * 4, dim * 2, 1, bias=bias)  # unused in forward (authors' module)
        self.decoder_level2 = blocks(dim * 2, num_blocks[1], True)
        self.up2_1 = Upsample(dim * 2)
        self.decoder_level1 = blocks(dim, num_blocks[0], True)
        self.refinement = blocks(dim, num_refinement_blocks, True)
        self.fuse2 = Fuse(dim * 2)
        self.fuse1 = Fuse(dim)
        self.output = nn.Conv2d(dim, out_channels, 3, 1, 1, bias=bias)
        self.reduce_chan_level2.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, SIZE_MULTIPLE)
        enc1 = self.encoder_level1(self.patch_embed(x))
        enc2 = self.encoder_level2(self.down1_2(enc1))
        dec3 = self.decoder_level3(self.encoder_level3(self.down2_3(enc2)))
        dec2 = self.decoder_level2(self.fuse2(self.up3_2(dec3), enc2))
        dec1 = self.refinement(self.decoder_level1(self.fuse1(self.up2_1(dec2), enc1)))
        return (self.output(dec1) + x)[..., :h, :w]


__all__ = ["DFFN", "FFTformer", "FSAS", "dft_bases", "from_patches", "to_patches", "unit_circle"]


def _recognise(s: StateShapes) -> dict:
    """FFTformer from its tensors: width and channels from the stem / output convs, blocks per level and
    refinement blocks, the feed-forward factor from its (doubled) hidden width, the bias switch."""
    dim = s.dim("patch_embed.proj.weight", 0)
    return {"inp_channels": s.dim("patch_embed.proj.weight", 1), "out_channels": s.dim("output.weight", 0),
            "dim": dim, "num_blocks": [s.count(f"encoder_level{i}.") for i in (1, 2, 3)],
            "num_refinement_blocks": s.count("refinement."),
            "ffn_expansion_factor": s.dim("encoder_level1.0.ffn.project_in.weight", 0) / 2 / dim,
            "bias": "output.bias" in s}


register_recogniser("FFTformer", _recognise)
