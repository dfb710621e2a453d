"""SPAN: Swift Parameter-free Attention Network for efficient SR (Wan et al., 2024; NTIRE 2024 ESR winner).

Module names, buffers and constructor arguments follow spandrel 0.4.2's SPAN (the authors' code plus
traiNNer's ``norm`` switch), so released checkpoints load with ``strict=True`` and give the same output:

* every 3x3 conv is a ``Conv3XC``: in training a 1x1 -> 3x3 -> 1x1 chain plus a 1x1 shortcut; in eval mode
  the same map folded into one 3x3 conv (``eval_conv``), recomputed from the chain on every call, so the
  ``eval_conv`` weights stored in a checkpoint never matter (as in the original);
* ``norm=True`` subtracts ``rgb_mean`` and multiplies by ``img_range`` on the way in (the output is *not*
  scaled back, as in the original); ``norm=False`` registers the persistent ``no_norm`` buffer by which
  such checkpoints are recognised, and feeds the input unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.ops.autocast import autocast_off
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


def check_int(arch: str, name: str, value: object, low: int) -> None:
    """Raise ArchArgumentError unless ``value`` is an integer (not a bool) of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArchArgumentError(name, f"{arch} needs an integer {name} >= {low}, got {value!r}")


class Conv3XC(nn.Module):
    """A re-parameterisable 3x3 conv: ``conv`` (1x1 to ``gain1 x`` channels, 3x3, 1x1 back) plus ``sk`` (1x1).

    Training runs both branches (the chain sees the zero-padded input, so the fold below is exact at the
    borders too). Eval folds them into ``eval_conv`` (written in place, without autograd) and runs that.
    ``gain2`` is accepted for the original signature and unused; ``relu`` adds a LeakyReLU(0.05).
    """

    def __init__(self, c_in: int, c_out: int, gain1: int = 1, gain2: int = 0, s: int = 1, bias: bool = True,
                 relu: bool = False) -> None:
        super().__init__()
        del gain2
        self.stride = s
        self.has_relu = relu
        mid_in, mid_out = c_in * gain1, c_out * gain1
        self.sk = nn.Conv2d(c_in, c_out, 1, stride=s, padding=0, bias=bias)
        self.conv = nn.Sequential(
            nn.Conv2d(c_in, mid_in, 1, padding=0, bias=bias),
            nn.Conv2d(mid_in, mid_out, 3, stride=s, padding=0, bias=bias),
            nn.Conv2d(mid_out, c_out, 1, padding=0, bias=bias),
        )
        self.eval_conv = nn.Conv2d(c_in, c_out, 3, stride=s, padding=1, bias=bias)
        # Derived from the branches above on every eval call: never trained (and so never an unused DDP parameter).
        self.eval_conv.requires_grad_(False)
        self.folded = False  # True after SPAN.reparameterize(): eval uses eval_conv as it is

    @torch.no_grad()
    def fused_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The single 3x3 conv (weight, bias) equal to ``conv(pad(x)) + sk(x)``, in the parameters' dtype."""
        first, middle, last = self.conv
        ref = middle.weight
        work = torch.promote_types(ref.dtype, torch.float32)
        with autocast_off(ref):
            w1 = first.weight.to(work).flatten(1)          # (m, c_in)
            w2 = middle.weight.to(work)                    # (n, m, 3, 3)
            w3 = last.weight.to(work).flatten(1)           # (c_out, n)
            # out[o, c, i, j] = sum_{n, m} w3[o, n] * w2[n, m, i, j] * w1[m, c]
            weight = (w3 @ w2.permute(2, 3, 0, 1) @ w1).permute(2, 3, 0, 1)
            weight[:, :, 1, 1] += self.sk.weight.to(work)[:, :, 0, 0]
            bias = None
            if first.bias is not None:
                mid_bias = w2.sum((2, 3)) @ first.bias.to(work) + middle.bias.to(work)
                bias = w3 @ mid_bias + last.bias.to(work) + self.sk.bias.to(work)
        dtype = self.eval_conv.weight.dtype
        return weight.to(dtype), None if bias is None else bias.to(dtype)

    @torch.no_grad()
    def update_params(self) -> None:
        """Write the folded weights into ``eval_conv`` (done by every eval-mode forward)."""
        weight, bias = self.fused_weight()
        self.eval_conv.weight.copy_(weight)
        if bias is not None and self.eval_conv.bias is not None:
            self.eval_conv.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            out = self.conv(F.pad(x, (1, 1, 1, 1))) + self.sk(x)
        else:
            if not self.folded:
                self.update_params()
            out = self.eval_conv(x)
        return F.leaky_relu(out, 0.05) if self.has_relu else out


def fold_conv3xc(net: nn.Module) -> None:
    """Fold every Conv3XC of ``net`` into its ``eval_conv`` once and stop refolding on each eval call (the
    deployment form of the networks built of them: their ``reparameterize()``)."""
    for module in net.modules():
        if isinstance(module, Conv3XC):
            module.update_params()
            module.folded = True


class SPAB(nn.Module):
    """Swift parameter-free attention block: three convs (``conv``: Conv3XC) with ``act`` (SiLU) between,
    attention ``attention(y)`` (``sigmoid(y) - 0.5``) applied to ``y + x``.

    Returns ``(block output, first activated features, attention map)``; SPAN concatenates the second of
    the last block. A block that changes the width (SPANF's first) has no ``x`` to add: it returns the last
    conv's output and no attention (None), as SPANF's. Subclasses change the convs, the activation or the
    attention (SPANF3's ``SPABV2``).
    """

    def __init__(self, in_channels: int, mid_channels: int | None = None, out_channels: int | None = None,
                 bias: bool = False, *, conv: Callable[..., nn.Module] = Conv3XC,
                 act: Callable[[], nn.Module] = nn.SiLU) -> None:
        super().__init__()
        del bias  # accepted for the original signature; the convs always have biases
        mid_channels = mid_channels or in_channels
        out_channels = out_channels or in_channels
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.c1_r = conv(in_channels, mid_channels, gain1=2, s=1)
        self.c2_r = conv(mid_channels, mid_channels, gain1=2, s=1)
        self.c3_r = conv(mid_channels, out_channels, gain1=2, s=1)
        self.act1 = act()

    def attention(self, y: torch.Tensor) -> torch.Tensor:
        """SPAN's parameter-free attention of the last conv's output."""
        return torch.sigmoid(y) - 0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        # The original's in-place activation also changes the first conv's output it returns: return it activated.
        out1 = self.act1(self.c1_r(x))
        out3 = self.c3_r(self.act1(self.c2_r(out1)))
        if self.out_channels != self.in_channels:
            return out3, out1, None
        att = self.attention(out3)
        return (out3 + x) * att, out1, att


@ARCH_REGISTRY.register()
class SPAN(nn.Module):
    """SPAN: a Conv3XC stem, six SPAB blocks, a 1x1 fusion of four feature maps and a PixelShuffle head.

    Args:
        num_in_ch, num_out_ch: image channels. feature_channels: body width (48 in the paper, 32 in SPAN-S).
        upscale: any integer >= 1. bias: accepted for the original signature (unused).
        norm: normalise the input with ``rgb_mean`` / ``img_range``; False registers the ``no_norm`` buffer.
        img_range, rgb_mean: input scale and per-channel mean (one value per input channel).
    """

    tile_multiple: int = 1

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, feature_channels: int = 48, upscale: int = 4,
                 bias: bool = True, norm: bool = True, img_range: float = 255.0,
                 rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040)) -> None:
        super().__init__()
        check_int("SPAN", "upscale", upscale, 1)
        if norm and len(rgb_mean) != num_in_ch:
            raise ArchArgumentError(
                "rgb_mean", f"SPAN has num_in_ch={num_in_ch} but rgb_mean has {len(rgb_mean)} values; give "
                f"{num_in_ch} values (or norm: false)")
        self.in_channels = num_in_ch
        self.out_channels = num_out_ch
        self.upscale = upscale
        self.img_range = img_range
        self.register_buffer("mean", torch.tensor([float(v) for v in rgb_mean]).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("no_norm", None if norm else torch.zeros(1))

        f = feature_channels
        self.conv_1 = Conv3XC(num_in_ch, f, gain1=2, s=1)
        self.block_1 = SPAB(f, bias=bias)
        self.block_2 = SPAB(f, bias=bias)
        self.block_3 = SPAB(f, bias=bias)
        self.block_4 = SPAB(f, bias=bias)
        self.block_5 = SPAB(f, bias=bias)
        self.block_6 = SPAB(f, bias=bias)
        self.conv_cat = nn.Conv2d(f * 4, f, 1, padding=0, bias=True)
        self.conv_2 = Conv3XC(f, f, gain1=2, s=1)
        self.upsampler = nn.Sequential(nn.Conv2d(f, num_out_ch * upscale**2, 3, padding=1), nn.PixelShuffle(upscale))

    def reparameterize(self) -> SPAN:
        """The deployment form: fold every Conv3XC into its ``eval_conv`` once, and stop refolding on each eval
        call (what ONNX export traces). The state dict is unchanged; do not train it further."""
        fold_conv3xc(self)
        return self

    @property
    def is_norm(self) -> bool:
        """Whether the input is normalised (no ``no_norm`` buffer)."""
        return self.no_norm is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_norm:
            x = (x - self.mean.to(x.dtype)) * self.img_range
        feat = self.conv_1(x)
        b1, _, _ = self.block_1(feat)
        b = b1
        for block in (self.block_2, self.block_3, self.block_4, self.block_5):
            b, _, _ = block(b)
        b6, b6_first, _ = self.block_6(b)
        out = self.conv_cat(torch.cat([feat, self.conv_2(b6), b1, b6_first], 1))
        return self.upsampler(out)


__all__ = ["SPAN", "SPAB", "Conv3XC", "check_int", "fold_conv3xc"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SPAN", scale_arg="upscale", fixed={"num_blocks": 6}, presets={
    "span": {"feature_channels": 52, "norm": False},  # 2.62 M parameters at x4
    "span_f32": {"feature_channels": 32, "norm": False},  # 1.00 M parameters at x4
    "span_f64": {"feature_channels": 64, "norm": False},  # 3.96 M parameters at x4
    "span_f96": {"feature_channels": 96, "norm": False},  # 8.88 M parameters at x4
    "span_s": {"norm": False},  # 2.24 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """SPAN from its tensors: input channels and width from the stem, output channels and scale from the
    upsampler's PixelShuffle width, input normalisation from the ``no_norm`` buffer (absent: normalised)."""
    cin, feat = s.dim("conv_1.sk.weight", 1), s.dim("conv_1.sk.weight", 0)
    s.shape("block_6.c1_r.sk.weight")
    norm = "no_norm" not in s
    out = []
    for cout, scale in shuffle_splits(s.dim("upsampler.0.weight", 0), (cin, 3, 1)):
        p = {"num_in_ch": cin, "num_out_ch": cout, "feature_channels": feat, "upscale": scale, "norm": norm}
        if norm and cin != 3:
            p["rgb_mean"] = (0.5,) * cin
        out.append(p)
    return out


register_recogniser("SPAN", _recognise)
