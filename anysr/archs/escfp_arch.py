"""ESC-FP: neosr's ``esc_fp``, the "FP" variant of ESC ("Emulating Self-attention with Convolution for Efficient
Image Super-Resolution", Lee, Yoon, Lee; ICCV 2025): neosr's ``esc`` built with ``is_fp=True, realsr=False``.

Against ESC-Real (anysr/archs/escreal_arch.py) each convolutional "attention emulation" unit decomposes its large
kernel: a 1x1 channel mix (``lk_channel``, shared by every block) then one depth-wise ``kernel_size`` kernel per
channel (``lk_spatial``, shared) plus a 3x3 depth-wise kernel predicted per image from the pooled channels; the
blocks' first ConvFFN expands 1.5x; a layer norm precedes the last conv; there is no side branch, and the head is a
3x3 conv to ``3 * scale**2`` channels, pixel-shuffled and added to the bicubic upscaled input. Window self-attention
and the ConvFFNs are ESC-Real's.

Module names and constructor arguments are neosr's, so its checkpoints load with ``strict=True`` and give the same
output; neosr's three attention back-ends ("sdpa", "flex", "naive") compute the same softmax, here all as
``F.scaled_dot_product_attention``. neosr's code runs only with ``kernel_size`` 13 (its dynamic kernel is padded to
13); any odd size >= 3 works here. The bicubic branch is gathers (anysr.archs.msdan_arch.bicubic_upscale: XLA
lowers them, ONNX keeps sizes symbolic), equal to ``F.interpolate(..., mode="bicubic")``.

Size requirement: none for the caller. Each attention pads its input to a multiple of ``window_size`` (reflect, then
edge replication) and crops back; ``tile_multiple`` is the window size, where tiles pad as training crops.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.escreal_arch import ConvFFN, WindowAttention
from anysr.archs.msdan_arch import bicubic_upscale
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import clean, square_side
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

ATTN_TYPES = ("sdpa", "flex", "naive")  # neosr's spellings (any case); all run as F.scaled_dot_product_attention
DYN_K = 3  # side of the predicted depth-wise kernel


class DecomposedConvolutionalAttention(nn.Module):
    """On the first ``pdim`` channels: the shared 1x1 ``lk_channel`` mix, then per channel the shared depth-wise
    ``lk_spatial`` kernel plus a per-image 3x3 kernel predicted from the (un-mixed) pooled channels (``proj``);
    the other channels pass unchanged."""

    def __init__(self, pdim: int) -> None:
        super().__init__()
        self.pdim = pdim
        self.proj = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(pdim, pdim // 4, 1), nn.GELU(),
                                  nn.Conv2d(pdim // 4, pdim * DYN_K * DYN_K, 1))

    def forward(self, x: torch.Tensor, lk_channel: torch.Tensor, lk_spatial: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        part, rest = x[:, :self.pdim], x[:, self.pdim:]
        kernels = self.proj(part).unflatten(1, (self.pdim, DYN_K * DYN_K))  # (b, pdim, 9, 1, 1)
        mixed = F.conv2d(part, lk_channel)
        # the reference adds the 3x3 kernel (zero-padded to the large one) to the large kernel and runs one
        # per-image grouped conv; the sum splits into the static depth-wise conv and nine shifted multiply-adds
        # (no reshape of the batch into channels: XLA and ONNX keep one graph for any batch)
        static = F.conv2d(mixed, lk_spatial, padding=lk_spatial.shape[-1] // 2, groups=self.pdim)
        padded = F.pad(mixed, (DYN_K // 2,) * 4)
        dynamic = sum(padded[:, :, i:i + h, j:j + w] * kernels[:, :, i * DYN_K + j]
                      for i in range(DYN_K) for j in range(DYN_K))
        return torch.cat((static + dynamic, rest), dim=1)


class DecomposedConvolutionalAttentionWrapper(nn.Module):
    """DecomposedConvolutionalAttention followed by a 1x1 channel mix."""

    def __init__(self, dim: int, pdim: int) -> None:
        super().__init__()
        self.plk = DecomposedConvolutionalAttention(pdim)
        self.aggr = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, lk_channel: torch.Tensor, lk_spatial: torch.Tensor) -> torch.Tensor:
        return self.aggr(self.plk(x, lk_channel, lk_spatial))


class Block(nn.Module):
    """ConvFFN (x1.5), window attention, ``conv_blocks`` (norm, ConvFFN, decomposed convolutional attention)
    steps, norm + 3x3 conv; the whole block residual."""

    def __init__(self, dim: int, pdim: int, conv_blocks: int, window_size: int, num_heads: int,
                 exp_ratio: float) -> None:
        super().__init__()
        self.ln_proj = LayerNorm2d(dim)
        self.proj = ConvFFN(dim, 3, 1.5)
        self.ln_attn = LayerNorm2d(dim)
        self.attn = WindowAttention(dim, window_size, num_heads)
        self.lns = nn.ModuleList(LayerNorm2d(dim) for _ in range(conv_blocks))
        self.pconvs = nn.ModuleList(DecomposedConvolutionalAttentionWrapper(dim, pdim) for _ in range(conv_blocks))
        self.convffns = nn.ModuleList(ConvFFN(dim, 3, exp_ratio) for _ in range(conv_blocks))
        self.ln_out = LayerNorm2d(dim)
        self.conv_out = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: torch.Tensor, lk_channel: torch.Tensor, lk_spatial: torch.Tensor) -> torch.Tensor:
        y = self.proj(self.ln_proj(x))
        y = y + self.attn(self.ln_attn(y))
        for ln, pconv, ffn in zip(self.lns, self.pconvs, self.convffns, strict=True):
            y = y + pconv(ffn(ln(y)), lk_channel, lk_spatial)
        return x + self.conv_out(self.ln_out(y))


def _positive_int(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArchArgumentError(name, f"ESCFP needs an integer {name} >= {minimum}, got {value!r}")


@ARCH_REGISTRY.register()
class ESCFP(nn.Module):
    """neosr's ``esc_fp`` (``esc`` with ``is_fp=True, realsr=False``); the defaults are ``esc_fp``'s.

    Args:
        dim: width. pdim: channels the convolutional attention works on (>= 4). kernel_size: odd side of the shared
        depth-wise kernel. n_blocks: blocks. conv_blocks: convolutional attention steps per block. window_size:
        attention window. num_heads: attention heads (a divisor of ``dim``). upscaling_factor: integer scale.
        exp_ratio: expansion of the conv-block ConvFFNs. attn_type: neosr's back-end name ("sdpa", "flex",
        "naive"; the same result).
    """

    def __init__(self, dim: int = 48, pdim: int = 16, kernel_size: int = 13, n_blocks: int = 5,
                 conv_blocks: int = 5, window_size: int = 32, num_heads: int = 3, upscaling_factor: int = 4,
                 exp_ratio: float = 1.25, attn_type: str = "sdpa") -> None:
        super().__init__()
        _positive_int("upscaling_factor", upscaling_factor)
        _positive_int("dim", dim)
        _positive_int("n_blocks", n_blocks, 0)
        _positive_int("conv_blocks", conv_blocks, 0)
        _positive_int("window_size", window_size)
        if not isinstance(pdim, int) or isinstance(pdim, bool) or not 4 <= pdim <= dim:
            raise ArchArgumentError("pdim", f"ESCFP needs 4 <= pdim <= dim ({dim}), got {pdim!r}")
        if not isinstance(kernel_size, int) or kernel_size < DYN_K or kernel_size % 2 == 0:
            raise ArchArgumentError("kernel_size", f"ESCFP needs an odd kernel_size >= 3, got {kernel_size!r}")
        if not isinstance(num_heads, int) or num_heads < 1 or dim % num_heads:
            raise ArchArgumentError("num_heads", f"ESCFP: dim ({dim}) must be a multiple of num_heads, "
                                                 f"got {num_heads!r}")
        if not isinstance(exp_ratio, int | float) or int(dim * exp_ratio) < 1:
            raise ArchArgumentError("exp_ratio", f"ESCFP needs a positive exp_ratio, got {exp_ratio!r}")
        if not isinstance(attn_type, str) or attn_type.lower() not in ATTN_TYPES:
            raise ArchArgumentError("attn_type", f"ESCFP: attn_type {attn_type!r} is not one of {ATTN_TYPES}")
        self.upscaling_factor = upscaling_factor
        self.tile_multiple = window_size
        self.proj = nn.Conv2d(3, dim, 3, 1, 1)
        self.last = nn.Conv2d(dim, dim, 3, 1, 1)
        self.lk_channel = nn.Parameter(torch.randn(pdim, pdim, 1, 1))
        self.lk_spatial = nn.Parameter(torch.empty(pdim, 1, kernel_size, kernel_size))
        nn.init.orthogonal_(self.lk_spatial)
        self.ln_last = LayerNorm2d(dim)
        self.blocks = nn.ModuleList(
            Block(dim, pdim, conv_blocks, window_size, num_heads, exp_ratio) for _ in range(n_blocks))
        self.to_img = nn.Conv2d(dim, 3 * upscaling_factor**2, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.proj(x)
        out = feat
        for block in self.blocks:
            out = block(out, self.lk_channel, self.lk_spatial)
        out = self.last(self.ln_last(out)) + feat
        s = self.upscaling_factor
        return F.pixel_shuffle(self.to_img(out), s) + bicubic_upscale(x, s)


# neosr's name (tests/test_neosr_names.py checks it against the network neosr builds): ``esc`` with ``is_fp`` and
# without ``realsr``; neosr refuses its own default ``use_dysample=True`` there, anysr builds the layout without it
register_presets("ESCFP", scale_arg="upscaling_factor", fixed={"is_fp": True, "realsr": False, "use_dysample": False},
                 source="neosr", presets={
    "esc_fp": {"dim": 48, "num_heads": 3},  # 0.54 M parameters at x4 (539,263; neosr: the same)
})


def _recognise(s: StateShapes) -> dict:
    """ESCFP from its tensors: width, the shared kernels (``pdim``, ``kernel_size``), blocks and conv blocks per
    block, heads and window from the attention's bias, the ConvFFN ratio, the scale from the head's channels."""
    pdim, _, kernel, _ = s.shape("lk_spatial")
    dim = s.dim("proj.weight", 0)
    bias = s.shape("blocks.0.attn.relative_position_bias")
    out = s.dim("to_img.weight", 0)
    return {"dim": dim, "pdim": pdim, "kernel_size": kernel, "n_blocks": s.count("blocks."),
            "conv_blocks": s.count("blocks.0.pconvs."),
            "window_size": (square_side(bias[1], "relative_position_bias") + 1) // 2, "num_heads": bias[0],
            "upscaling_factor": square_side(out // 3, "to_img.weight"),
            "exp_ratio": clean(s.dim("blocks.0.convffns.0.proj.weight", 0) / dim)}


register_recogniser("ESCFP", _recognise)
