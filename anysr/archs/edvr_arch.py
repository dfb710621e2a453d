"""EDVR: video restoration with pyramid / cascading / deformable (PCD) alignment and temporal-spatial attention
(TSA) fusion (Wang et al., 2019).

Module names follow BasicSR 1.4.2, so its EDVR checkpoints (M: 64 features, 5 + 10 blocks; L: 128 features,
5 + 40 blocks; with or without TSA, predeblur, HR input) load with ``strict=True`` and give its outputs. The
deformable convolutions are anysr's pure-PyTorch DCNv2 (``anysr.ops.dcn``), so EDVR runs on any device.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, DCNv2Pack, ResidualBlockNoBN, make_layer
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


def _lrelu() -> nn.LeakyReLU:
    return nn.LeakyReLU(negative_slope=0.1, inplace=True)


def _upsample2(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class PCDAlignment(nn.Module):
    """Aligns a neighbour frame's 3-level feature pyramid to the reference frame's.

    From the coarsest level (L3, 1/4 size) to L1, offsets are predicted from both frames' features and the
    (doubled, upsampled) offsets of the level below, a DCN aligns the neighbour's features, and the aligned
    features are merged with the upsampled ones; a last cascading DCN refines L1.
    """

    def __init__(self, num_feat: int = 64, deformable_groups: int = 8) -> None:
        super().__init__()
        if deformable_groups < 1 or num_feat % deformable_groups:
            raise ArchArgumentError("deformable_groups", f"{deformable_groups!r} must divide num_feat {num_feat}")
        self.offset_conv1 = nn.ModuleDict()
        self.offset_conv2 = nn.ModuleDict()
        self.offset_conv3 = nn.ModuleDict()
        self.dcn_pack = nn.ModuleDict()
        self.feat_conv = nn.ModuleDict()
        for i in (3, 2, 1):
            level = f"l{i}"
            self.offset_conv1[level] = nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1)
            if i == 3:
                self.offset_conv2[level] = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            else:
                self.offset_conv2[level] = nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1)
                self.offset_conv3[level] = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.dcn_pack[level] = DCNv2Pack(num_feat, num_feat, 3, padding=1, deformable_groups=deformable_groups)
            if i < 3:
                self.feat_conv[level] = nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1)
        self.cas_offset_conv1 = nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1)
        self.cas_offset_conv2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.cas_dcnpack = DCNv2Pack(num_feat, num_feat, 3, padding=1, deformable_groups=deformable_groups)
        self.lrelu = _lrelu()

    def forward(self, nbr_feat_l: list[torch.Tensor], ref_feat_l: list[torch.Tensor]) -> torch.Tensor:
        """``nbr_feat_l`` / ``ref_feat_l``: [L1, L2, L3] features (b, c, h / 2**k, w / 2**k); returns (b, c, h, w)."""
        prev_offset: torch.Tensor | None = None
        prev_feat: torch.Tensor | None = None
        feat = nbr_feat_l[0]
        for i in (3, 2, 1):
            level = f"l{i}"
            nbr, ref = nbr_feat_l[i - 1], ref_feat_l[i - 1]
            offset = self.lrelu(self.offset_conv1[level](torch.cat([nbr, ref], dim=1)))
            if prev_offset is None:
                offset = self.lrelu(self.offset_conv2[level](offset))
            else:
                offset = self.lrelu(self.offset_conv2[level](torch.cat([offset, prev_offset], dim=1)))
                offset = self.lrelu(self.offset_conv3[level](offset))
            feat = self.dcn_pack[level](nbr, offset)
            if prev_feat is not None:
                feat = self.feat_conv[level](torch.cat([feat, prev_feat], dim=1))
            if i > 1:
                feat = self.lrelu(feat)
                # Offsets are in pixels of their level: twice as many on the next, finer one.
                prev_offset = _upsample2(offset) * 2
                prev_feat = _upsample2(feat)
        offset = self.lrelu(self.cas_offset_conv1(torch.cat([feat, ref_feat_l[0]], dim=1)))
        offset = self.lrelu(self.cas_offset_conv2(offset))
        return self.lrelu(self.cas_dcnpack(feat, offset))


class TSAFusion(nn.Module):
    """Temporal attention (each frame weighted by its per-pixel correlation with the centre frame) then a fusion
    conv, modulated by a two-level spatial attention pyramid: ``feat * 2 * sigmoid(attn) + attn_add``.
    """

    def __init__(self, num_feat: int = 64, num_frame: int = 5, center_frame_idx: int = 2) -> None:
        super().__init__()
        self.center_frame_idx = center_frame_idx
        self.temporal_attn1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.temporal_attn2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.feat_fusion = nn.Conv2d(num_frame * num_feat, num_feat, 1, 1)
        self.max_pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.avg_pool = nn.AvgPool2d(3, stride=2, padding=1)
        self.spatial_attn1 = nn.Conv2d(num_frame * num_feat, num_feat, 1)
        self.spatial_attn2 = nn.Conv2d(num_feat * 2, num_feat, 1)
        self.spatial_attn3 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.spatial_attn4 = nn.Conv2d(num_feat, num_feat, 1)
        self.spatial_attn5 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.spatial_attn_l1 = nn.Conv2d(num_feat, num_feat, 1)
        self.spatial_attn_l2 = nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1)
        self.spatial_attn_l3 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.spatial_attn_add1 = nn.Conv2d(num_feat, num_feat, 1)
        self.spatial_attn_add2 = nn.Conv2d(num_feat, num_feat, 1)
        self.lrelu = _lrelu()

    def _pool_pair(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.max_pool(x), self.avg_pool(x)], dim=1)

    def forward(self, aligned_feat: torch.Tensor) -> torch.Tensor:
        """(b, t, c, h, w) aligned features -> (b, c, h, w)."""
        b, t, c, h, w = aligned_feat.shape
        emb_ref = self.temporal_attn1(aligned_feat[:, self.center_frame_idx])
        emb = self.temporal_attn2(aligned_feat.reshape(b * t, c, h, w)).view(b, t, -1, h, w)
        corr = torch.sigmoid((emb * emb_ref.unsqueeze(1)).sum(dim=2, keepdim=True))  # (b, t, 1, h, w)
        weighted = (aligned_feat * corr).reshape(b, t * c, h, w)

        feat = self.lrelu(self.feat_fusion(weighted))

        attn = self.lrelu(self.spatial_attn1(weighted))
        attn = self.lrelu(self.spatial_attn2(self._pool_pair(attn)))
        attn_level = self.lrelu(self.spatial_attn_l1(attn))
        attn_level = self.lrelu(self.spatial_attn_l2(self._pool_pair(attn_level)))
        attn_level = _upsample2(self.lrelu(self.spatial_attn_l3(attn_level)))
        attn = self.lrelu(self.spatial_attn3(attn)) + attn_level
        attn = _upsample2(self.lrelu(self.spatial_attn4(attn)))
        attn = self.spatial_attn5(attn)
        attn_add = self.spatial_attn_add2(self.lrelu(self.spatial_attn_add1(attn)))
        return feat * torch.sigmoid(attn) * 2 + attn_add


class PredeblurModule(nn.Module):
    """Pre-deblurring feature extractor: a 3-level pyramid of residual blocks (input /4 first when ``hr_in``)."""

    def __init__(self, num_in_ch: int = 3, num_feat: int = 64, hr_in: bool = False) -> None:
        super().__init__()
        self.hr_in = hr_in
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        if hr_in:
            self.stride_conv_hr1 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
            self.stride_conv_hr2 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.stride_conv_l2 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.stride_conv_l3 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.resblock_l3 = ResidualBlockNoBN(num_feat=num_feat)
        self.resblock_l2_1 = ResidualBlockNoBN(num_feat=num_feat)
        self.resblock_l2_2 = ResidualBlockNoBN(num_feat=num_feat)
        self.resblock_l1 = nn.ModuleList(ResidualBlockNoBN(num_feat=num_feat) for _ in range(5))
        self.lrelu = _lrelu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        l1 = self.lrelu(self.conv_first(x))
        if self.hr_in:
            l1 = self.lrelu(self.stride_conv_hr2(self.lrelu(self.stride_conv_hr1(l1))))
        l2 = self.lrelu(self.stride_conv_l2(l1))
        l3 = self.lrelu(self.stride_conv_l3(l2))
        l2 = self.resblock_l2_1(l2) + _upsample2(self.resblock_l3(l3))
        l2 = _upsample2(self.resblock_l2_2(l2))
        for block in self.resblock_l1[:2]:
            l1 = block(l1)
        l1 = l1 + l2
        for block in self.resblock_l1[2:]:
            l1 = block(l1)
        return l1


def feature_pyramid(net: nn.Module, feat_l1: torch.Tensor, b: int, t: int) -> list[torch.Tensor]:
    """L1 features (b*t, c, h, w) -> [L1, L2, L3] as (b, t, c, h / 2**k, w / 2**k) with ``net``'s
    ``conv_l2_1/2`` and ``conv_l3_1/2`` stride-2 stages."""
    feat_l2 = net.lrelu(net.conv_l2_2(net.lrelu(net.conv_l2_1(feat_l1))))
    feat_l3 = net.lrelu(net.conv_l3_2(net.lrelu(net.conv_l3_1(feat_l2))))
    return [f.view(b, t, *f.shape[1:]) for f in (feat_l1, feat_l2, feat_l3)]


def align_frames(pcd: PCDAlignment, levels: list[torch.Tensor], center: int) -> torch.Tensor:
    """PCD-align every frame of a (b, t, ...) pyramid to frame ``center``; returns (b, t, c, h, w)."""
    ref = [f[:, center] for f in levels]
    return torch.stack([pcd([f[:, i] for f in levels], ref) for i in range(levels[0].shape[1])], dim=1)


@ARCH_REGISTRY.register()
class EDVR(nn.Module):
    """EDVR: (b, t, c, h, w) frames -> the centre frame restored at 4x (or at input size with ``hr_in``).

    Args:
        num_in_ch, num_out_ch: image channels (must be equal: the upsampled centre frame is added).
        num_feat: feature channels (M: 64, L: 128). num_frame: frames per input.
        deformable_groups: DCN deformable groups (must divide num_feat).
        num_extract_block, num_reconstruct_block: residual blocks before alignment / after fusion.
        center_frame_idx: reference frame (default ``num_frame // 2``).
        hr_in: the input is already at output size (deblurring; needs ``with_predeblur``): features are
            computed at 1/4 size.
        with_predeblur: a pre-deblurring pyramid instead of the first conv.
        with_tsa: TSA fusion; otherwise a 1x1 conv over the concatenated frames.

    Height and width must be multiples of 4 (16 with ``hr_in``).
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 64, num_frame: int = 5,
                 deformable_groups: int = 8, num_extract_block: int = 5, num_reconstruct_block: int = 10,
                 center_frame_idx: int | None = None, hr_in: bool = False, with_predeblur: bool = False,
                 with_tsa: bool = True) -> None:
        super().__init__()
        if num_out_ch != num_in_ch:
            raise ArchArgumentError("num_out_ch", f"EDVR adds the upsampled centre frame to its output, so "
                                                  f"num_out_ch ({num_out_ch}) must equal num_in_ch ({num_in_ch})")
        if not isinstance(num_frame, int) or num_frame < 1:
            raise ArchArgumentError("num_frame", f"must be a positive integer, got {num_frame!r}")
        if hr_in and not with_predeblur:
            raise ArchArgumentError("hr_in", "needs with_predeblur: true (only the predeblur module brings "
                                             "high-resolution input down to the feature size)")
        center = num_frame // 2 if center_frame_idx is None else center_frame_idx
        if not 0 <= center < num_frame:
            raise ArchArgumentError("center_frame_idx", f"{center_frame_idx!r} is not a frame index of "
                                                        f"num_frame={num_frame}")
        self.center_frame_idx = center
        self.num_frame = num_frame
        self.hr_in = hr_in
        self.with_predeblur = with_predeblur
        self.with_tsa = with_tsa

        if with_predeblur:
            self.predeblur = PredeblurModule(num_in_ch=num_in_ch, num_feat=num_feat, hr_in=hr_in)
            self.conv_1x1 = nn.Conv2d(num_feat, num_feat, 1, 1)
        else:
            self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.feature_extraction = make_layer(ResidualBlockNoBN, num_extract_block, num_feat=num_feat)
        self.conv_l2_1 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.conv_l2_2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_l3_1 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.conv_l3_2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)

        self.pcd_align = PCDAlignment(num_feat=num_feat, deformable_groups=deformable_groups)
        if with_tsa:
            self.fusion: nn.Module = TSAFusion(num_feat=num_feat, num_frame=num_frame, center_frame_idx=center)
        else:
            self.fusion = nn.Conv2d(num_frame * num_feat, num_feat, 1, 1)

        self.reconstruction = make_layer(ResidualBlockNoBN, num_reconstruct_block, num_feat=num_feat)
        # BasicSR's layout: the second upsampling stage always has 64 channels.
        self.upconv1 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1)
        self.upconv2 = nn.Conv2d(num_feat, 64 * 4, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = nn.Conv2d(64, 64, 3, 1, 1)
        self.conv_last = nn.Conv2d(64, num_out_ch, 3, 1, 1)
        self.lrelu = _lrelu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 5:
            raise ValueError(f"EDVR: expected frames (b, t, c, h, w), got shape {tuple(x.shape)}")
        b, t, c, h, w = x.shape
        mult = 16 if self.hr_in else 4
        if t != self.num_frame or h % mult or w % mult:
            raise ValueError(f"EDVR(num_frame={self.num_frame}, hr_in={self.hr_in}): got {t} frames of {h}x{w}; "
                             f"needs {self.num_frame} frames with height and width multiples of {mult} "
                             f"(pad the frames)")
        x_center = x[:, self.center_frame_idx]
        frames = x.reshape(b * t, c, h, w)
        if self.with_predeblur:
            feat_l1 = self.conv_1x1(self.predeblur(frames))
        else:
            feat_l1 = self.lrelu(self.conv_first(frames))
        feat_l1 = self.feature_extraction(feat_l1)
        levels = feature_pyramid(self, feat_l1, b, t)
        aligned = align_frames(self.pcd_align, levels, self.center_frame_idx)
        if not self.with_tsa:
            aligned = aligned.flatten(1, 2)
        feat = self.fusion(aligned)

        out = self.reconstruction(feat)
        out = self.lrelu(self.pixel_shuffle(self.upconv1(out)))
        out = self.lrelu(self.pixel_shuffle(self.upconv2(out)))
        out = self.conv_last(self.lrelu(self.conv_hr(out)))
        base = x_center if self.hr_in else F.interpolate(x_center, scale_factor=4, mode="bilinear",
                                                         align_corners=False)
        return out + base


__all__ = ["EDVR", "PCDAlignment", "PredeblurModule", "TSAFusion", "align_frames", "feature_pyramid"]


def _recognise(s: StateShapes) -> dict:
    """EDVR from its tensors: width and channels from the first / last convs, the frame count from the fusion's
    input, deformable groups from the offset convs (3 x 9 per group), block counts, the predeblur / high-resolution
    input / TSA switches from which layers exist."""
    feat = s.dim("conv_l2_1.weight", 0)
    tsa = "fusion.feat_fusion.weight" in s
    frames = s.dim("fusion.feat_fusion.weight" if tsa else "fusion.weight", 1) // feat
    predeblur = "predeblur.conv_first.weight" in s
    cin = s.dim("predeblur.conv_first.weight" if predeblur else "conv_first.weight", 1)
    return {"num_in_ch": cin, "num_out_ch": s.dim("conv_last.weight", 0), "num_feat": feat, "num_frame": frames,
            "deformable_groups": s.dim("pcd_align.dcn_pack.l1.conv_offset.weight", 0) // 27,
            "num_extract_block": s.count("feature_extraction."),
            "num_reconstruct_block": s.count("reconstruction."),
            "hr_in": "predeblur.stride_conv_hr1.weight" in s, "with_predeblur": predeblur, "with_tsa": tsa}


register_recogniser("EDVR", _recognise)
