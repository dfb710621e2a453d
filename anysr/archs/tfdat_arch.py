"""TFDAT: temporal FDAT (traiNNer-redux's ``tfdat``): clip in, centre frame out (input (b, t, c, h, w), output
(b, c, h * scale, w * scale)).

A light flow network (three stride-2 convs, a flow at 1/8 size upsampled bilinearly and times 8) estimates each
neighbour frame's flow to the centre frame; the neighbours are warped by it (bilinear, border clamping) and summed.
At x1 / x2 the centre frame and the sum are pixel-unshuffled (by 4 / scale; the body then works at x4), at x3 and up
a small residual conv stem enriches both; the sum is then divided by the neighbour count (after the stem, as the
original). One 3x3 conv embeds each, a fusion (1x1 conv on both, LeakyReLU, 3x3 conv) joins them,
and FDAT's body and upsampler follow (blocks from ``anysr.archs.fdat_arch``). Frames are padded at the bottom /
right to a multiple of the flow's 8 and the (unshuffled) window (reflect; replicate where reflection cannot reach)
and the output cropped, as the original.

Module names and constructor arguments are those of traiNNer-redux's ``tfdat`` builder (its defaults: width 120,
"transpose+conv" upsampler), so its checkpoints load with ``strict=True`` and give its outputs. The frame count is
not part of the weights: any odd clip length runs (``clip_size`` only says which the options feed).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, drop_path_rates, flow_warp
from anysr.archs.fdat_arch import (
    BLOCK_TYPES,
    SimplifiedResidualGroup,
    UniUpsampleV3,
    _init_weights,
    _keep_own_meta,
)
from anysr.archs.fdat_arch import _recognise as fdat_recognise
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.resize_util import resize_bilinear
from anysr.archs.temporal_span_arch import check_clip
from anysr.registry import ARCH_REGISTRY


class LightFlowNet(nn.Module):
    """Flow from ``src`` to ``tgt`` (n, c, h, w) -> (n, 2, h, w) in pixels: three stride-2 convs (LeakyReLU 0.2),
    a 3x3 flow conv at 1/8 size, bilinear upsampling to (h, w), times 8."""

    def __init__(self, in_ch: int = 3, base_ch: int = 32) -> None:
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(in_ch * 2, base_ch, 3, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(base_ch, base_ch * 2, 3, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(base_ch * 2, base_ch * 4, 3, 2, 1), nn.LeakyReLU(0.2))
        self.flow_pred = nn.Conv2d(base_ch * 4, 2, 3, 1, 1)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        low = self.flow_pred(self.enc(torch.cat([src, tgt], dim=1)))
        return resize_bilinear(low, (src.shape[-2], src.shape[-1]), align_corners=False) * 8.0


@ARCH_REGISTRY.register()
class TFDAT(nn.Module):
    """TFDAT (see the module docstring); the FDAT arguments are FDAT's."""

    video_window = True  # clip in, centre frame out (num_frame frames): a window network

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, scale: int = 4, embed_dim: int = 120,
                 num_groups: int = 4, depth_per_group: int = 3, num_heads: int = 4, window_size: int = 8,
                 ffn_expansion_ratio: float = 2.0, aim_reduction_ratio: int = 8,
                 group_block_pattern: list[str] | None = None, drop_path_rate: float = 0.1, mid_dim: int = 64,
                 upsampler_type: str = "transpose+conv", flow_base_ch: int = 32, clip_size: int = 5) -> None:
        super().__init__()
        pattern = list(group_block_pattern) if group_block_pattern is not None else list(BLOCK_TYPES)
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"TFDAT needs an integer scale >= 1, got {scale!r}")
        if isinstance(clip_size, bool) or not isinstance(clip_size, int) or clip_size < 1 or clip_size % 2 == 0:
            raise ArchArgumentError("clip_size", f"TFDAT predicts the centre frame: clip_size must be odd, got "
                                    f"{clip_size!r}")
        if num_heads < 1 or embed_dim % num_heads:
            raise ArchArgumentError("num_heads", f"TFDAT needs embed_dim ({embed_dim}) to be a multiple of "
                                    f"num_heads ({num_heads})")
        if window_size < 1:
            raise ArchArgumentError("window_size", f"TFDAT needs window_size >= 1, not {window_size}")
        if aim_reduction_ratio < 1 or embed_dim < aim_reduction_ratio:
            raise ArchArgumentError("aim_reduction_ratio", f"TFDAT needs 1 <= aim_reduction_ratio <= embed_dim "
                                    f"({embed_dim}), not {aim_reduction_ratio}")
        if not pattern or any(p not in BLOCK_TYPES for p in pattern):
            raise ArchArgumentError("group_block_pattern", f"TFDAT's blocks are 'spatial' or 'channel', not {pattern}")
        self.num_frame = self.clip_size = clip_size
        self.upscale, self.num_in_ch = scale, num_in_ch
        self.unshuffle = 4 // scale if scale <= 2 else 1
        self.flow_net = LightFlowNet(num_in_ch, flow_base_ch)
        if self.unshuffle == 1:
            self.shallow_stem = nn.Sequential(nn.Conv2d(num_in_ch, embed_dim // 2, 3, 1, 1), nn.LeakyReLU(0.2),
                                              nn.Conv2d(embed_dim // 2, num_in_ch, 3, 1, 1))
        else:
            self.shallow_stem = None
        self.conv_first = nn.Conv2d(num_in_ch * self.unshuffle**2, embed_dim, 3, 1, 1)
        self.temporal_fuse = nn.Sequential(nn.Conv2d(embed_dim * 2, embed_dim, 1, 1, 0), nn.LeakyReLU(0.2),
                                           nn.Conv2d(embed_dim, embed_dim, 3, 1, 1))
        depth = depth_per_group * len(pattern)
        rates = drop_path_rates(drop_path_rate, num_groups * depth)
        self.groups = nn.Sequential(*[
            SimplifiedResidualGroup(embed_dim, depth, num_heads, window_size, ffn_expansion_ratio,
                                    aim_reduction_ratio, pattern, rates[i * depth:(i + 1) * depth])
            for i in range(num_groups)])
        self.conv_after = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1, bias=False)
        self.upsampler = UniUpsampleV3(upsampler_type, scale if self.unshuffle == 1 else 4, embed_dim, num_out_ch,
                                       mid_dim, 4)
        self.align = math.lcm(self.unshuffle * window_size, 8)
        self.tile_multiple = self.align  # frames are padded to it (the flow's 8, the unshuffled window)
        self.apply(_init_weights)
        if self.shallow_stem is not None:  # near-identity start of the residual stem
            nn.init.zeros_(self.shallow_stem[-1].bias)
            with torch.no_grad():
                self.shallow_stem[-1].weight.mul_(0.1)
        self.register_load_state_dict_pre_hook(_keep_own_meta)

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        if self.unshuffle > 1:
            return F.pixel_unshuffle(x, self.unshuffle)
        assert self.shallow_stem is not None
        return self.shallow_stem(x) + x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_clip("TFDAT", x, None)
        b, t, c, h, w = x.shape
        pad_h, pad_w = (-h) % self.align, (-w) % self.align
        if pad_h or pad_w:
            mode = "reflect" if pad_h < h and pad_w < w else "replicate"
            x = F.pad(x.reshape(b * t, c, h, w), (0, pad_w, 0, pad_h), mode=mode).view(b, t, c, h + pad_h, w + pad_w)
        hp, wp = x.shape[-2:]
        mid = t // 2
        center = x[:, mid]
        others = torch.cat([x[:, :mid], x[:, mid + 1:]], dim=1).reshape(b * (t - 1), c, hp, wp)
        centers = center.unsqueeze(1).expand(b, t - 1, c, hp, wp).reshape(b * (t - 1), c, hp, wp)
        flow = self.flow_net(others, centers)
        aligned = flow_warp(others, flow.permute(0, 2, 3, 1), "bilinear", "border", align_corners=True)
        aligned = self._stem(aligned.view(b, t - 1, c, hp, wp).sum(dim=1)) / max(t - 1, 1)  # the original's order
        shallow = self.temporal_fuse(torch.cat([self.conv_first(self._stem(center)), self.conv_first(aligned)], 1))
        out = self.upsampler(self.conv_after(self.groups(shallow)) + shallow)
        return out[:, :, : h * self.upscale, : w * self.upscale]


__all__ = ["TFDAT", "LightFlowNet"]


def _recognise(s: StateShapes) -> list[dict]:
    """TFDAT: FDAT's recogniser on the body and head (the stem's input is the unshuffled or plain frame), the flow
    network's width; x1 / x2 (unshuffled stem) and x3+ (shallow stem) are told apart by the shallow stem."""
    base = s.dim("flow_net.enc.0.weight", 0)
    cin = s.dim("flow_net.enc.0.weight", 1) // 2
    stem_in = s.dim("conv_first.weight", 1)
    shallow = "shallow_stem.0.weight" in s
    fdat_state = {k: v for k, v in s.shapes.items() if not k.startswith(("flow_net.", "shallow_stem.",
                                                                          "temporal_fuse."))}
    fdat_state["conv_first.weight"] = (s.dim("conv_first.weight", 0), cin, 3, 3)
    found = []
    for p in fdat_recognise(StateShapes(fdat_state)):
        if p["num_in_ch"] != cin:
            continue
        if shallow:
            if p["scale"] < 3:
                continue
            scale = p["scale"]
        else:
            if p["scale"] != 4:
                continue
            unshuffle = round((stem_in // cin) ** 0.5)
            if unshuffle not in (2, 4):
                continue
            scale = 4 // unshuffle
        args = {k: v for k, v in p.items() if k not in ("unshuffle_mod", "num_in_ch", "scale")}
        found.append({"num_in_ch": cin, **args, "scale": scale, "flow_base_ch": base})
    return found


register_recogniser("TFDAT", _recognise)
