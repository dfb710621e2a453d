"""SRVGGNetCompact: the compact VGG-style network of Real-ESRGAN's anime-video / general-x4v3 models."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

ACTIVATIONS = ("relu", "prelu", "leakyrelu")


def _activation(act_type: str, num_feat: int) -> nn.Module:
    if act_type == "relu":
        return nn.ReLU(inplace=True)
    if act_type == "prelu":
        return nn.PReLU(num_parameters=num_feat)
    return nn.LeakyReLU(negative_slope=0.1, inplace=True)


@ARCH_REGISTRY.register()
class SRVGGNetCompact(nn.Module):
    """A plain stack of 3x3 convs + activations on the LR grid; the last conv feeds a PixelShuffle and
    the nearest-upsampled input is added, so the network learns a residual.

    Args:
        num_in_ch, num_out_ch: image channels. num_feat: body channels. num_conv: body convs.
        upscale: any integer >= 1. act_type: 'relu', 'prelu' or 'leakyrelu'.
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 64, num_conv: int = 16,
                 upscale: int = 4, act_type: str = "prelu") -> None:
        super().__init__()
        if act_type not in ACTIVATIONS:
            raise ArchArgumentError(
                "act_type",
                f"SRVGGNetCompact: unknown act_type {act_type!r}; use one of {', '.join(ACTIVATIONS)}",
            )
        if not isinstance(upscale, int) or upscale < 1:
            raise ArchArgumentError(
                "upscale", f"SRVGGNetCompact needs an integer upscale >= 1, got {upscale!r}"
            )
        self.num_in_ch = num_in_ch
        self.num_out_ch = num_out_ch
        self.num_feat = num_feat
        self.num_conv = num_conv
        self.upscale = upscale
        self.act_type = act_type

        layers: list[nn.Module] = [nn.Conv2d(num_in_ch, num_feat, 3, 1, 1), _activation(act_type, num_feat)]
        for _ in range(num_conv):
            layers += [nn.Conv2d(num_feat, num_feat, 3, 1, 1), _activation(act_type, num_feat)]
        layers.append(nn.Conv2d(num_feat, num_out_ch * upscale * upscale, 3, 1, 1))
        self.body = nn.ModuleList(layers)
        self.upsampler = nn.PixelShuffle(upscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for layer in self.body:
            out = layer(out)
        out = self.upsampler(out)
        return out + F.interpolate(x, scale_factor=self.upscale, mode="nearest")


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SRVGGNetCompact", scale_arg="upscale", fixed={"learn_residual": True}, presets={
    "compact": {},  # 0.62 M parameters at x4
    "superultracompact": {"num_feat": 24, "num_conv": 8},  # 0.05 M parameters at x4
    "ultracompact": {"num_conv": 8},  # 0.33 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """SRVGGNetCompact from its tensors: [conv, act] x (num_conv + 1), then the conv feeding the PixelShuffle
    (PReLU has weights; ReLU and LeakyReLU have none and look alike: ReLU is proposed)."""
    feat, cin = s.dim("body.0.weight", 0), s.dim("body.0.weight", 1)
    last = max(s.indices("body."))
    if last % 2:
        return []
    act = "prelu" if "body.1.weight" in s else "relu"
    return [{"num_in_ch": cin, "num_out_ch": out, "num_feat": feat, "num_conv": (last - 2) // 2, "upscale": scale,
             "act_type": act}
            for out, scale in shuffle_splits(s.dim(f"body.{last}.weight", 0), (cin, 3, 1))]


register_recogniser("SRVGGNetCompact", _recognise)
