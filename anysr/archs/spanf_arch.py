"""SPANF and SPANF3: traiNNer-redux's SPAN variants (``spanf_arch.py`` / ``spanf3_arch.py``).

Module names and constructor arguments follow traiNNer-redux's classes, so its checkpoints load with
``strict=True`` and give its outputs; its registered names ``spanf`` and ``spanf3`` (functions taking ``scale``)
are presets here (their defaults). Both are built from SPAN's ``SPAB`` and fully convolutional.

* ``SPANF``: SPAN's blocks in their deployment form only: every "Conv3XC" is just its folded 3x3 conv
  (``eval_conv``), frozen as traiNNer-redux's (``requires_grad`` off: training moves only the grouped 3x3
  ``conv_near`` and the 1x1 ``conv_cat``). A grouped conv of the image (``num_in_ch * upscale**2`` maps), five
  blocks (the first widens the image to ``feature_channels`` without attention), a 1x1 fusion of the near maps and
  the first and last blocks, a folded 3x3 conv to ``num_in_ch * upscale**2`` channels and a PixelShuffle: the
  output has the input's channels (traiNNer-redux ignores ``num_out_ch``; here it must equal ``num_in_ch``).
  traiNNer-redux's constructor also moves the network to CUDA and runs one random image through it (so it builds
  on a GPU, RGB only); anysr does neither.
* ``SPANF3``: SPAN's re-parameterisable ``Conv3XC`` (two branches in training, refolded in eval,
  ``reparameterize()`` for export), ``num_blocks`` blocks with ReLU and a learned attention
  ``tanh(att_conv(y))`` (a 1x1 conv, initialised to zero weights and bias 3), a 1x1 fusion of the stem, the last
  block, the first block and the last block's first activated features, and a Conv3XC + PixelShuffle head.
  ``unshuffle_mod`` (the ``spanf3`` preset's default) runs x1 / x2 as x4 on a 4 / 2 times pixel-unshuffled input,
  padded at the bottom / right to a multiple of the unshuffle factor (reflect, then edge replication where a side is
  too short to reflect; traiNNer-redux reflects only) and cropped back.

On XLA and in ONNX: nothing here needs a resize (no ``F.interpolate``); the pixel (un)shuffles are reshapes and
the padding a pad, which XLA lowers (forward and backward) and ONNX exports at symbolic sizes.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser, shuffle_splits
from anysr.archs.span_arch import SPAB, Conv3XC, check_int, fold_conv3xc
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class EvalConv3XC(nn.Module):
    """SPANF's "Conv3XC": only the folded 3x3 conv (``eval_conv``; SPAN's Conv3XC without its branches), frozen
    as in traiNNer-redux, in both modes. ``gain1`` / ``gain2`` are accepted for the original signature."""

    def __init__(self, c_in: int, c_out: int, gain1: int = 1, gain2: int = 0, s: int = 1, bias: bool = True) -> None:
        super().__init__()
        del gain1, gain2
        self.eval_conv = nn.Conv2d(c_in, c_out, 3, stride=s, padding=1, bias=bias)
        self.eval_conv.requires_grad_(False)  # traiNNer-redux never trains it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.eval_conv(x)


@ARCH_REGISTRY.register()
class SPANF(nn.Module):
    """SPANF (see the module docstring).

    Args:
        num_in_ch: image channels (also the output's). num_out_ch: must equal num_in_ch.
        feature_channels: body width (traiNNer-redux's ``spanf``: 32). upscale: any integer >= 1.
        bias: accepted for the original signature (unused).
    """

    tile_multiple: int = 1

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, feature_channels: int = 48, upscale: int = 4,
                 bias: bool = True) -> None:
        super().__init__()
        check_int("SPANF", "upscale", upscale, 1)
        check_int("SPANF", "num_in_ch", num_in_ch, 1)
        if num_out_ch != num_in_ch:
            raise ArchArgumentError("num_out_ch", f"SPANF outputs its input's channels (num_in_ch={num_in_ch}; "
                                    f"traiNNer-redux's ignores num_out_ch), got num_out_ch={num_out_ch!r}")
        c, f, s = num_in_ch, feature_channels, upscale
        self.in_channels = c
        self.upscale = s
        self.conv_near = nn.Conv2d(c, c * s * s, 3, padding=1, groups=c, bias=False)
        self.block_1 = SPAB(c, f, f, bias=bias, conv=EvalConv3XC)
        self.block_2 = SPAB(f, bias=bias, conv=EvalConv3XC)
        self.block_3 = SPAB(f, bias=bias, conv=EvalConv3XC)
        self.block_4 = SPAB(f, bias=bias, conv=EvalConv3XC)
        self.block_5 = SPAB(f, bias=bias, conv=EvalConv3XC)
        self.conv_cat = nn.Conv2d(f * 2 + c * s * s, f, 1, padding=0, bias=True)
        self.conv_2 = EvalConv3XC(f, c * s * s, gain1=2, s=1)
        self.depth_to_space = nn.PixelShuffle(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        near = self.conv_near(x)
        b1, _, _ = self.block_1(x)
        b = b1
        for block in (self.block_2, self.block_3, self.block_4, self.block_5):
            b, _, _ = block(b)
        return self.depth_to_space(self.conv_2(self.conv_cat(torch.cat([near, b, b1], 1))))


class SPABV2(SPAB):
    """SPANF3's block: SPAB with ReLU and a learned attention ``tanh(att_conv(y))`` (a 1x1 conv starting at zero
    weights and bias 3: ``tanh(3)``, nearly 1, everywhere). Returns ``(output, first activated features,
    attention)``."""

    def __init__(self, in_channels: int, mid_channels: int | None = None, out_channels: int | None = None,
                 bias: bool = False) -> None:
        super().__init__(in_channels, mid_channels, out_channels, bias, act=nn.ReLU)
        self.att_conv = nn.Conv2d(self.out_channels, self.out_channels, 1, bias=True)
        nn.init.zeros_(self.att_conv.weight)
        nn.init.constant_(self.att_conv.bias, 3.0)

    def attention(self, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.att_conv(y))


@ARCH_REGISTRY.register()
class SPANF3(nn.Module):
    """SPANF3 (see the module docstring).

    Args:
        num_in_ch, num_out_ch: image channels. feature_channels: body width. num_blocks: SPABV2 blocks (>= 0).
        upscale: any integer >= 1. bias: accepted for the original signature (unused).
        unshuffle_mod: at x1 / x2, run the network at x4 on the input pixel-unshuffled by ``4 // upscale``
            (ignored at x3 and above, as in traiNNer-redux).
    """

    tile_multiple: int = 1  # set per instance: the unshuffle factor

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, feature_channels: int = 48, num_blocks: int = 6,
                 upscale: int = 4, bias: bool = True, unshuffle_mod: bool = False) -> None:
        super().__init__()
        check_int("SPANF3", "upscale", upscale, 1)
        check_int("SPANF3", "num_blocks", num_blocks, 0)
        f = feature_channels
        self.in_channels = num_in_ch  # what export / inference feed (the stem may see pixel-unshuffled channels)
        self.upscale = upscale
        self.num_blocks = num_blocks
        unshuffle = 4 // upscale if unshuffle_mod and upscale < 3 else 0
        head = 4 if unshuffle else upscale
        self.pad = unshuffle
        self.tile_multiple = unshuffle or 1
        if unshuffle:
            self.conv_1: nn.Module = nn.Sequential(nn.PixelUnshuffle(unshuffle),
                                                   Conv3XC(num_in_ch * unshuffle**2, f, gain1=2, s=1))
        else:
            self.conv_1 = Conv3XC(num_in_ch, f, gain1=2, s=1)
        for i in range(1, num_blocks + 1):
            setattr(self, f"block_{i}", SPABV2(f, bias=bias))
        self.conv_cat = nn.Conv2d(f * 4, f, 1, padding=0, bias=True)
        self.to_pixel = Conv3XC(f, num_out_ch * head**2, gain1=2, s=1)
        self.upsampler = nn.PixelShuffle(head)

    def reparameterize(self) -> SPANF3:
        """The deployment form: every Conv3XC folded once (see SPAN.reparameterize)."""
        fold_conv3xc(self)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.pad:
            x = pad_to_multiple(x, self.pad)[0]
        feat = self.conv_1(x)
        out = first = mid = feat
        for i in range(1, self.num_blocks + 1):
            out, mid, _ = getattr(self, f"block_{i}")(out)
            if i == 1:
                first = out
        out = self.upsampler(self.to_pixel(self.conv_cat(torch.cat([feat, out, first, mid], 1))))
        return out[:, :, : h * self.upscale, : w * self.upscale]


__all__ = ["SPANF", "SPANF3", "SPABV2", "EvalConv3XC"]


# traiNNer-redux's names (functions taking ``scale``) with their defaults; tests/test_presets.py checks each against
# the network traiNNer-redux builds.
register_presets("SPANF", scale_arg="upscale", presets={
    "spanf": {"feature_channels": 32},  # 0.15 M parameters at x4 (4,048 trained: the rest are frozen)
})
register_presets("SPANF3", scale_arg="upscale", presets={
    "spanf3": {"unshuffle_mod": True},  # 2.23 M parameters at x4 (1.83 M trained; the rest are the folded convs)
})

_PREFERRED_CHANNELS = (3, 1, 4)


def _recognise_spanf(s: StateShapes) -> list[dict]:
    """SPANF from its tensors: image channels and width from the first block's first conv, the scale from the
    grouped near conv (``num_in_ch * upscale**2`` maps)."""
    feat, cin = s.dim("block_1.c1_r.eval_conv.weight", 0), s.dim("block_1.c1_r.eval_conv.weight", 1)
    s.shape("conv_2.eval_conv.weight")
    return [{"num_in_ch": cin, "num_out_ch": cin, "feature_channels": feat, "upscale": scale}
            for _, scale in shuffle_splits(s.dim("conv_near.weight", 0), (cin,))]


def _recognise_spanf3(s: StateShapes) -> list[dict]:
    """SPANF3 from its tensors: the stem (after a PixelUnshuffle: ``conv_1.1``) gives the width and input channels,
    the blocks their count, the head's PixelShuffle width the output channels and scale. An unshuffled stem is x2
    (unshuffle 2) or x1 (unshuffle 4) with a x4 head; the usual image channels are tried first."""
    unshuffle = "conv_1.1.sk.weight" in s
    stem = "conv_1.1.sk.weight" if unshuffle else "conv_1.sk.weight"
    feat, stem_in = s.dim(stem, 0), s.dim(stem, 1)
    blocks = s.indices("block_")
    if blocks != list(range(1, len(blocks) + 1)):
        raise NotThisFamily(f"blocks {blocks}")
    s.shape("conv_cat.weight")
    head = s.dim("to_pixel.sk.weight", 0)
    common = {"feature_channels": feat, "num_blocks": len(blocks)}
    if not unshuffle:
        return [{**common, "num_in_ch": stem_in, "num_out_ch": cout, "upscale": scale}
                for cout, scale in shuffle_splits(head, (stem_in, 3, 1))]
    out = [{**common, "num_in_ch": stem_in // (u * u), "num_out_ch": head // 16, "upscale": 4 // u,
            "unshuffle_mod": True}
           for u in (2, 4) if stem_in % (u * u) == 0 and head % 16 == 0]
    return sorted(out, key=lambda p: _PREFERRED_CHANNELS.index(p["num_in_ch"])
                  if p["num_in_ch"] in _PREFERRED_CHANNELS else len(_PREFERRED_CHANNELS))


register_recogniser("SPANF", _recognise_spanf)
register_recogniser("SPANF3", _recognise_spanf3)
