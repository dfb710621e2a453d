"""ArtCNN: a plain residual CNN for anime / art upscaling by Artoriuz (2024; mpv shaders), PyTorch port by umzi2.

Module names and constructor arguments follow traiNNer-redux's ``ArtCNN``, so its checkpoints load with
``strict=True`` and give the same output: a conv stem, ``n_block`` residual blocks (conv-act, conv-act, conv) and
a conv with a long shortcut, then a conv to ``in_ch * scale**2`` channels and PixelShuffle ("depth to space").
Every conv keeps the size ("same" padding), so any input size works (``tile_multiple = 1``).
"""

from __future__ import annotations

from torch import Tensor, nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "mish": nn.Mish,
                                           "leakyrelu": nn.LeakyReLU, "prelu": nn.PReLU, "elu": nn.ELU}


def _same_conv(filters_in: int, filters_out: int, kernel_size: int) -> nn.Conv2d:
    """A stride-1 conv that keeps the size (symmetric padding for odd kernels, as 'same' does)."""
    padding = kernel_size // 2 if kernel_size % 2 else "same"
    return nn.Conv2d(filters_in, filters_out, kernel_size, 1, padding=padding)


def _activation(act: type[nn.Module] | str) -> type[nn.Module]:
    if isinstance(act, str):
        name = act.lower().replace("_", "")
        if name not in ACTIVATIONS:
            raise ArchArgumentError("act", f"ArtCNN has no activation {act!r}; use one of {', '.join(ACTIVATIONS)}")
        return ACTIVATIONS[name]
    if not (isinstance(act, type) and issubclass(act, nn.Module)):
        raise ArchArgumentError("act", f"ArtCNN needs an activation name or nn.Module class, got {act!r}")
    return act


class DepthToSpace(nn.Module):
    """Conv to ``out_ch * scale**2`` channels, then PixelShuffle."""

    def __init__(self, filters: int, out_ch: int, kernel_size: int, scale: int) -> None:
        super().__init__()
        self.upscale = nn.Sequential(_same_conv(filters, out_ch * scale**2, kernel_size), nn.PixelShuffle(scale))

    def forward(self, x: Tensor) -> Tensor:
        return self.upscale(x)


class ActConv(nn.Sequential):
    """Same-size conv followed by the activation."""

    def __init__(self, filters: int, kernel_size: int, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__(_same_conv(filters, filters, kernel_size), act())


class ResBlock(nn.Module):
    """``x + conv(act(conv(act(conv(x)))))``."""

    def __init__(self, filters: int, kernel_size: int, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.conv = nn.Sequential(ActConv(filters, kernel_size, act), ActConv(filters, kernel_size, act),
                                  _same_conv(filters, filters, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x)


@ARCH_REGISTRY.register()
class ArtCNN(nn.Module):
    """ArtCNN. Args: in_ch: image channels (in and out). scale: integer >= 1. filters: width. n_block: residual
    blocks. kernel_size: conv size. act: activation class or name (relu, gelu, silu, mish, ...; no weights)."""

    tile_multiple: int = 1

    def __init__(self, in_ch: int = 3, scale: int = 4, filters: int = 96, n_block: int = 16, kernel_size: int = 3,
                 act: type[nn.Module] | str = nn.ReLU) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"ArtCNN needs an integer scale >= 1, got {scale!r}")
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1:
            raise ArchArgumentError("kernel_size", f"ArtCNN needs an integer kernel_size >= 1, got {kernel_size!r}")
        act_cls = _activation(act)
        self.scale = scale
        self.conv0 = _same_conv(in_ch, filters, kernel_size)
        self.res_block = nn.Sequential(*[ResBlock(filters, kernel_size, act_cls) for _ in range(n_block)],
                                       _same_conv(filters, filters, kernel_size))
        self.depth_to_space = DepthToSpace(filters, in_ch, kernel_size, scale)

    def forward(self, x: Tensor) -> Tensor:
        feat = self.conv0(x)
        return self.depth_to_space(self.res_block(feat) + feat)


__all__ = ["ArtCNN"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("ArtCNN", scale_arg="scale", presets={
    "artcnn_r16f96": {"filters": 96, "n_block": 16},  # 4.11 M parameters at x4
    "artcnn_r8f64": {"filters": 64, "n_block": 8},  # 0.95 M
    "artcnn_r8f48": {"filters": 48, "n_block": 8},  # 0.54 M
    "artcnn_r5f48": {"filters": 48, "n_block": 5},  # 0.35 M
    "artcnn_r8f24": {"filters": 24, "n_block": 8},  # 0.14 M
    "artcnn_r3f24": {"filters": 24, "n_block": 3},  # 0.06 M
})


def _recognise(s: StateShapes) -> list[dict]:
    """ArtCNN from its tensors: width, image channels and kernel size from the first conv, depth from the residual
    blocks (the last ``res_block`` entry is a plain conv), the scale from the depth-to-space conv's width."""
    filters, in_ch, _, k = s.shape("conv0.weight")
    out = s.dim("depth_to_space.upscale.0.weight", 0)
    return [{"in_ch": c, "scale": scale, "filters": filters, "n_block": s.count("res_block.") - 1, "kernel_size": k}
            for c, scale in shuffle_splits(out, (in_ch,))]


register_recogniser("ArtCNN", _recognise)
