"""MoSRv2: Mamba-out super-resolution, second version (umzi2, 2025; no paper, code in traiNNer-redux), after
MambaOut (Yu & Wang, CVPR 2025) with Inception depth-wise convs (InceptionNeXt, Yu et al., CVPR 2024).

Module names, the ``to_img.MetaUpsample`` buffer and constructor arguments follow traiNNer-redux's ``MoSRv2``, so
its checkpoints load with ``strict=True`` and give the same output. Not the same network as anysr's ``MoSR``
(spandrel's first version): a stem (a pixel-unshuffle first with ``unshuffle_mod`` at scale 1 or 2), ``n_block``
gated CNN blocks (layer norm or RMS norm, a 3x3 conv to a Mish gate and a value whose last ``dim`` channels go
through Inception depth-wise convs, a 3x3 conv back, Mish, a learned per-channel ``gamma``, residual), a conv tail,
one of traiNNer-redux's version-3 heads, plus the bilinearly upscaled input.

Size requirement: with ``unshuffle_mod`` the input is padded to a multiple of the unshuffle factor (reflect; edge
replication past one side length) and the output cropped; ``tile_multiple`` is that factor (1 otherwise).
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_multiple
from anysr.archs.escreal_arch import SUPPORTED_HEADS, UniUpsampleV3
from anysr.archs.lkfmixer_arch import bilinear_resize
from anysr.archs.moesr_arch import InceptionDWConv2d, uniupsample_heads
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, width_ratio
from anysr.registry import ARCH_REGISTRY


class RMSNorm(nn.Module):
    """``x / (rms over channels + eps) * scale + offset`` (``scale`` / ``offset`` of shape (C, 1, 1))."""

    def __init__(self, dim: int = 64, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim, 1, 1))
        self.offset = nn.Parameter(torch.zeros(dim, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = x.square().mean(1, keepdim=True).sqrt()
        return x / (rms + self.eps) * self.scale + self.offset


class GatedCNNBlock(nn.Module):
    """``x + gamma * mish(fc2(mish(g) * cat(i, inception(c))))`` with ``g, i, c`` split from ``fc1(norm(x))``."""

    def __init__(self, dim: int = 64, expansion_ratio: float = 8 / 3, rms_norm: bool = True) -> None:
        super().__init__()
        hidden = int(expansion_ratio * dim)
        self.norm = RMSNorm(dim) if rms_norm else LayerNorm2d(dim)
        self.fc1 = nn.Conv2d(dim, hidden * 2, 3, 1, 1)
        self.act = nn.Mish()
        self.split_indices = [hidden, hidden - dim, dim]
        self.conv = InceptionDWConv2d(dim)
        self.fc2 = nn.Conv2d(hidden, dim, 3, 1, 1)
        self.gamma = nn.Parameter(torch.ones(1, dim, 1, 1))
        for m in (self.fc1, self.fc2, self.conv.dwconv_hw, self.conv.dwconv_w, self.conv.dwconv_h):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, ident, conv = torch.split(self.fc1(self.norm(x)), self.split_indices, dim=1)
        value = torch.cat((ident, self.conv(conv)), dim=1)
        return x + self.act(self.fc2(self.act(gate) * value)) * self.gamma


@ARCH_REGISTRY.register()
class MoSRv2(nn.Module):
    """MoSRv2 (traiNNer-redux's defaults)."""

    def __init__(self, in_ch: int = 3, scale: int = 4, n_block: int = 24, dim: int = 64,
                 upsampler: str = "pixelshuffledirect", expansion_ratio: float = 1.5, mid_dim: int = 32,
                 unshuffle_mod: bool = True, rms_norm: bool = False) -> None:
        super().__init__()
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"MoSRv2 needs an integer scale >= 1, got {scale!r}")
        if upsampler not in SUPPORTED_HEADS:
            raise ArchArgumentError("upsampler", f"MoSRv2: upsampler {upsampler!r}; use one of {SUPPORTED_HEADS}")
        if not isinstance(dim, int) or dim < 8:
            raise ArchArgumentError("dim", f"MoSRv2 needs an integer dim >= 8 (Inception branches of dim / 8), "
                                           f"got {dim!r}")
        if int(expansion_ratio * dim) < dim:
            raise ArchArgumentError("expansion_ratio", f"MoSRv2 needs expansion_ratio >= 1, got {expansion_ratio!r}")
        self.scale = scale
        self.in_channels = in_ch  # what the exporter feeds (the first conv may read an unshuffled input)
        self.pad = 1
        head_scale = scale
        if unshuffle_mod and scale < 3:
            self.pad = 4 // scale
            head_scale = 4
            stem: list[nn.Module] = [nn.PixelUnshuffle(self.pad), nn.Conv2d(in_ch * self.pad**2, dim, 3, 1, 1)]
        else:
            stem = [nn.Conv2d(in_ch, dim, 3, 1, 1)]
        if upsampler == "transpose+conv" and head_scale not in (2, 3, 4):
            raise ArchArgumentError("scale", f"MoSRv2's transpose+conv head supports scale 2, 3 or 4, not {scale}")
        if upsampler in ("pixelshuffle", "nearest+conv") and head_scale & (head_scale - 1) and head_scale != 3:
            raise ArchArgumentError("scale", f"MoSRv2's {upsampler} head needs a power of two or 3, not {scale}")
        self.gblocks = nn.Sequential(
            *stem, *(GatedCNNBlock(dim, expansion_ratio, rms_norm) for _ in range(n_block)),
            nn.Conv2d(dim, dim * 2, 3, 1, 1), nn.Mish(True), nn.Conv2d(dim * 2, dim, 3, 1, 1), nn.Mish(True),
            nn.Conv2d(dim, dim, 1))
        self.to_img = UniUpsampleV3(upsampler, head_scale, dim, in_ch, mid_dim)
        self.tile_multiple = self.pad

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:  # noqa: ANN002
        # the head's record comes from the constructor arguments (traiNNer-redux overwrites it on load too)
        key = prefix + "to_img.MetaUpsample"
        if key in state_dict:
            state_dict[key] = self.to_img.MetaUpsample
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.pad)
        s = self.scale
        out = self.to_img(self.gblocks(x)) + bilinear_resize(x, x.shape[-2] * s, x.shape[-1] * s)
        return out[:, :, :h * s, :w * s]


def _recognise(s: StateShapes) -> list[dict]:
    """MoSRv2 from its tensors: the stem (a plain conv, or a conv after a pixel-unshuffle by 4 // scale below
    x3) gives image channels, width and scale, the gated blocks their count, hidden width and norm kind, the
    head its kind and the scale it upsamples by."""
    if "gblocks.0.weight" in s:
        cin, dim, folds = s.dim("gblocks.0.weight", 1), s.dim("gblocks.0.weight", 0), [1]
        first = 1
    else:
        cin, dim, folds = s.dim("gblocks.1.weight", 1), s.dim("gblocks.1.weight", 0), [2, 4]
        first = 2
    blocks = [i for i in s.indices("gblocks.") if f"gblocks.{i}.fc1.weight" in s]
    common: dict = {"dim": dim, "n_block": len(blocks)}
    if blocks:
        common["expansion_ratio"] = width_ratio(s.dim(f"gblocks.{first}.fc1.weight", 0) // 2, dim, 1.5)
        common["rms_norm"] = f"gblocks.{first}.norm.scale" in s
    out = []
    for fold in folds:
        if cin % (fold * fold):
            continue
        in_ch = cin // (fold * fold)
        heads = uniupsample_heads(s, "to_img.", (in_ch,))
        if fold == 1 and s.integers("to_img.MetaUpsample") is None:  # x2 would unshuffle by default: x3 first
            heads.sort(key=lambda h: h["upsampler"] == "nearest+conv" and h["scale"] == 2)
        for head in heads:
            if fold == 1 and head["scale"] is not None:
                scale, unshuffle = head["scale"], head["scale"] >= 3
            elif fold > 1 and head["scale"] in (4, None):
                scale, unshuffle = 4 // fold, True
            else:
                continue
            out.append({**common, "in_ch": in_ch, "scale": scale, "unshuffle_mod": unshuffle,
                        **{k: v for k, v in head.items() if k not in ("scale", "out")}})
    return out


register_recogniser("MoSRv2", _recognise)
