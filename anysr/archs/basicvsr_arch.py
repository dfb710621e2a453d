"""BasicVSR and IconVSR: bidirectional recurrent video super-resolution with SPyNet flow alignment (Chan et al.,
2021).

Module names follow BasicSR 1.4.2, so its checkpoints load with ``strict=True`` and give its outputs (x4).
Inputs are (b, t, 3, h, w) with any ``t >= 2``; IconVSR also works for sequences shorter than its
EDVR window (BasicSR needs ``t >= 2 * temporal_padding + 1``), see ``IconVSR``. Pretrained SPyNet / EDVR
files are never opened here (``spynet_path`` / ``edvr_path`` must be None): the engine loads weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, ResidualBlockNoBN, flow_warp, make_layer, refuse_weights_path
from anysr.archs.edvr_arch import PCDAlignment, TSAFusion, align_frames, feature_pyramid
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.spynet_arch import SpyNet
from anysr.registry import ARCH_REGISTRY


class ConvResidualBlocks(nn.Module):
    """conv3x3 + LeakyReLU(0.1) + ``num_block`` residual blocks (``main.0`` / ``main.2.<i>`` as in BasicSR)."""

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 64, num_block: int = 15) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(num_in_ch, num_out_ch, 3, 1, 1, bias=True),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            make_layer(ResidualBlockNoBN, num_block, num_feat=num_out_ch),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def check_frames(name: str, x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Shape of a (b, t, 3, h, w) clip with t >= 2, or ValueError naming the architecture."""
    if x.dim() != 5 or x.shape[1] < 2 or x.shape[2] != 3:
        raise ValueError(f"{name}: expected RGB frames (b, t, 3, h, w) with t >= 2, got shape {tuple(x.shape)}")
    b, t, c, h, w = x.shape
    return b, t, c, h, w


def clip_flows(spynet: SpyNet, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flows between neighbouring frames of (b, t, c, h, w), each (b, t - 1, 2, h, w).

    Returns ``(forward, backward)``: ``forward[:, i]`` warps frame i's features onto frame i + 1 (used while
    propagating forward in time), ``backward[:, i]`` warps frame i + 1's onto frame i.
    """
    b, t, c, h, w = x.shape
    earlier = x[:, :-1].reshape(-1, c, h, w)
    later = x[:, 1:].reshape(-1, c, h, w)
    backward = spynet(earlier, later).view(b, t - 1, 2, h, w)
    forward = spynet(later, earlier).view(b, t - 1, 2, h, w)
    return forward, backward


def warp_features(feat: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """``flow_warp`` with a (b, 2, h, w) flow."""
    return flow_warp(feat, flow.permute(0, 2, 3, 1))


class _X4Reconstruction(nn.Module):
    """What BasicVSR and IconVSR share: SPyNet flows, the backward propagation, and the x4 tail ((pixel-shuffle
    x2, LeakyReLU) twice, conv_hr, conv_last, plus the bilinear x4 frame)."""

    num_feat: int
    spynet: SpyNet
    backward_trunk: ConvResidualBlocks
    backward_fusion: nn.Conv2d
    upconv1: nn.Conv2d
    upconv2: nn.Conv2d
    conv_hr: nn.Conv2d
    conv_last: nn.Conv2d
    pixel_shuffle: nn.PixelShuffle
    lrelu: nn.LeakyReLU

    def _build_tail(self, num_feat: int) -> None:
        self.upconv1 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1, bias=True)
        self.upconv2 = nn.Conv2d(num_feat, 64 * 4, 3, 1, 1, bias=True)
        self.conv_hr = nn.Conv2d(64, 64, 3, 1, 1)
        self.conv_last = nn.Conv2d(64, 3, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.lrelu = nn.LeakyReLU(negative_slope=0.1, inplace=True)

    def _upsample(self, feat: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        out = self.lrelu(self.pixel_shuffle(self.upconv1(feat)))
        out = self.lrelu(self.pixel_shuffle(self.upconv2(out)))
        out = self.conv_last(self.lrelu(self.conv_hr(out)))
        return out + F.interpolate(frame, scale_factor=4, mode="bilinear", align_corners=False)

    def get_flow(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flows_forward, flows_backward)``, see ``clip_flows``."""
        return clip_flows(self.spynet, x)

    def _propagate_backward(self, x: torch.Tensor, flows_backward: torch.Tensor,
                            refill: dict[int, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per-frame features of the backward branch, last frame first: warp the running feature to frame
        ``i``, fuse ``refill[i]`` there (``backward_fusion``; IconVSR's keyframes), then ``backward_trunk``."""
        b, t, _, h, w = x.shape
        feats: list[torch.Tensor] = [x.new_zeros(0)] * t
        feat = x.new_zeros(b, self.num_feat, h, w)
        for i in range(t - 1, -1, -1):
            if i < t - 1:
                feat = warp_features(feat, flows_backward[:, i])
            if refill is not None and i in refill:
                feat = self.backward_fusion(torch.cat([feat, refill[i]], dim=1))
            feat = self.backward_trunk(torch.cat([x[:, i], feat], dim=1))
            feats[i] = feat
        return feats


@ARCH_REGISTRY.register()
class BasicVSR(_X4Reconstruction):
    """BasicVSR: features propagated backward then forward through the clip, each step aligned with SPyNet
    flow, fused per frame and upsampled x4. (b, t, 3, h, w) -> (b, t, 3, 4h, 4w).

    Args:
        num_feat: feature channels. num_block: residual blocks per propagation branch.
        spynet_path: must be None (BasicSR loaded SPyNet weights here; anysr's engine loads weights).
    """

    def __init__(self, num_feat: int = 64, num_block: int = 15, spynet_path: str | None = None) -> None:
        super().__init__()
        refuse_weights_path("spynet_path", spynet_path, "SpyNet")
        self.num_feat = num_feat
        self.spynet = SpyNet()
        self.backward_trunk = ConvResidualBlocks(num_feat + 3, num_feat, num_block)
        self.forward_trunk = ConvResidualBlocks(num_feat + 3, num_feat, num_block)
        self.fusion = nn.Conv2d(num_feat * 2, num_feat, 1, 1, 0, bias=True)
        self._build_tail(num_feat)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = check_frames("BasicVSR", x)[1]
        flows_forward, flows_backward = self.get_flow(x)
        backward_feats = self._propagate_backward(x, flows_backward)

        outputs = []
        feat = torch.zeros_like(backward_feats[0])
        for i in range(t):
            if i > 0:
                feat = warp_features(feat, flows_forward[:, i - 1])
            feat = self.forward_trunk(torch.cat([x[:, i], feat], dim=1))
            fused = self.lrelu(self.fusion(torch.cat([backward_feats[i], feat], dim=1)))
            outputs.append(self._upsample(fused, x[:, i]))
        return torch.stack(outputs, dim=1)


class EDVRFeatureExtractor(nn.Module):
    """EDVR without its reconstruction: PCD-aligned, TSA-fused features of a window's centre frame (IconVSR's
    keyframe branch; 5 extraction blocks and 8 deformable groups as in BasicSR).

    Args:
        num_input_frame: frames per window. num_feat: feature channels.
        load_path: must be None (pretrained EDVR weights are loaded by the engine).
    """

    def __init__(self, num_input_frame: int, num_feat: int, load_path: str | None = None) -> None:
        super().__init__()
        refuse_weights_path("edvr_path", load_path, "EDVR")
        self.center_frame_idx = num_input_frame // 2
        self.conv_first = nn.Conv2d(3, num_feat, 3, 1, 1)
        self.feature_extraction = make_layer(ResidualBlockNoBN, 5, num_feat=num_feat)
        self.conv_l2_1 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.conv_l2_2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_l3_1 = nn.Conv2d(num_feat, num_feat, 3, 2, 1)
        self.conv_l3_2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.pcd_align = PCDAlignment(num_feat=num_feat, deformable_groups=8)
        self.fusion = TSAFusion(num_feat=num_feat, num_frame=num_input_frame, center_frame_idx=self.center_frame_idx)
        self.lrelu = nn.LeakyReLU(negative_slope=0.1, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, t, 3, h, w) window, h and w multiples of 4 -> (b, num_feat, h, w)."""
        b, t, c, h, w = x.shape
        feat_l1 = self.feature_extraction(self.lrelu(self.conv_first(x.reshape(b * t, c, h, w))))
        levels = feature_pyramid(self, feat_l1, b, t)
        return self.fusion(align_frames(self.pcd_align, levels, self.center_frame_idx))


def reflect_index(i: int, t: int) -> int:
    """Index ``i`` reflected into ``[0, t)`` without repeating the end frames (period ``2 * (t - 1)``)."""
    if t == 1:
        return 0
    period = 2 * (t - 1)
    i %= period
    return i if i < t else period - i


def temporal_pad_indices(t: int, pad: int) -> list[int]:
    """Frame indices of a clip of ``t`` frames padded by ``pad`` frames at each end, as IconVSR pads.

    BasicSR prepends frames ``2p, ..., p + 1`` and appends ``t - p - 2, ..., t - 2p - 1`` (p = 2 or 3); the same
    rule is used for any ``p``, and indices beyond a short clip are reflected into it.
    """
    left = [2 * pad - k for k in range(pad)]
    right = [t - pad - 2 - k for k in range(pad)]
    return [reflect_index(i, t) for i in left] + list(range(t)) + [reflect_index(i, t) for i in right]


@ARCH_REGISTRY.register()
class IconVSR(_X4Reconstruction):
    """IconVSR: BasicVSR with EDVR features injected at keyframes (information refill) and the backward
    features fed into the forward branch (coupled propagation). (b, t, 3, h, w) -> (b, t, 3, 4h, 4w).

    Frames are reflect-padded to multiples of 4 for EDVR and the output cropped back. Keyframes are every
    ``keyframe_stride``-th frame and the last one; each is described by an EDVR window of
    ``2 * temporal_padding + 1`` frames from the temporally padded clip (see ``temporal_pad_indices``).

    Args:
        num_feat, num_block: as BasicVSR. keyframe_stride: distance between keyframes.
        temporal_padding: frames on each side of a keyframe in its EDVR window.
        spynet_path, edvr_path: must be None (the engine loads pretrained weights).
    """

    def __init__(self, num_feat: int = 64, num_block: int = 15, keyframe_stride: int = 5,
                 temporal_padding: int = 2, spynet_path: str | None = None, edvr_path: str | None = None) -> None:
        super().__init__()
        refuse_weights_path("spynet_path", spynet_path, "SpyNet")
        refuse_weights_path("edvr_path", edvr_path, "EDVR")
        if not isinstance(keyframe_stride, int) or keyframe_stride < 1:
            raise ArchArgumentError("keyframe_stride", f"must be a positive integer, got {keyframe_stride!r}")
        if not isinstance(temporal_padding, int) or temporal_padding < 0:
            raise ArchArgumentError("temporal_padding", f"must be an integer >= 0, got {temporal_padding!r}")
        if num_feat % 8:
            raise ArchArgumentError("num_feat", f"IconVSR's EDVR branch uses 8 deformable groups, so num_feat must "
                                                f"be a multiple of 8, got {num_feat!r}")
        self.num_feat = num_feat
        self.temporal_padding = temporal_padding
        self.keyframe_stride = keyframe_stride
        self.edvr = EDVRFeatureExtractor(temporal_padding * 2 + 1, num_feat)
        self.spynet = SpyNet()
        self.backward_fusion = nn.Conv2d(2 * num_feat, num_feat, 3, 1, 1, bias=True)
        self.backward_trunk = ConvResidualBlocks(num_feat + 3, num_feat, num_block)
        self.forward_fusion = nn.Conv2d(2 * num_feat, num_feat, 3, 1, 1, bias=True)
        self.forward_trunk = ConvResidualBlocks(2 * num_feat + 3, num_feat, num_block)
        self._build_tail(num_feat)

    @staticmethod
    def pad_spatial(x: torch.Tensor) -> torch.Tensor:
        """Reflect-pad (b, t, c, h, w) frames at the bottom / right to multiples of 4."""
        b, t, c, h, w = x.shape
        pad_h, pad_w = (-h) % 4, (-w) % 4
        if not pad_h and not pad_w:
            return x
        x = F.pad(x.reshape(b * t, c, h, w), [0, pad_w, 0, pad_h], mode="reflect")
        return x.view(b, t, c, h + pad_h, w + pad_w)

    def keyframe_indices(self, t: int) -> list[int]:
        """Every ``keyframe_stride``-th frame, and the last frame."""
        idx = list(range(0, t, self.keyframe_stride))
        if idx[-1] != t - 1:
            idx.append(t - 1)
        return idx

    def get_keyframe_feature(self, x: torch.Tensor, keyframe_idx: list[int]) -> dict[int, torch.Tensor]:
        """EDVR features of every keyframe, from windows of the temporally padded clip (one batched call)."""
        b, t = x.shape[:2]
        padded = x[:, temporal_pad_indices(t, self.temporal_padding)]
        size = 2 * self.temporal_padding + 1
        windows = torch.stack([padded[:, i:i + size] for i in keyframe_idx], dim=1)  # (b, k, size, c, h, w)
        feats = self.edvr(windows.flatten(0, 1)).view(b, len(keyframe_idx), self.num_feat, *x.shape[-2:])
        return {i: feats[:, k] for k, i in enumerate(keyframe_idx)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, t, _, h_in, w_in = check_frames("IconVSR", x)
        x = self.pad_spatial(x)
        keyframe_idx = self.keyframe_indices(t)
        flows_forward, flows_backward = self.get_flow(x)
        keyframe_feats = self.get_keyframe_feature(x, keyframe_idx)
        backward_feats = self._propagate_backward(x, flows_backward, keyframe_feats)

        outputs = []
        feat = torch.zeros_like(backward_feats[0])
        for i in range(t):
            if i > 0:
                feat = warp_features(feat, flows_forward[:, i - 1])
            if i in keyframe_feats:
                feat = self.forward_fusion(torch.cat([feat, keyframe_feats[i]], dim=1))
            feat = self.forward_trunk(torch.cat([x[:, i], backward_feats[i], feat], dim=1))
            outputs.append(self._upsample(feat, x[:, i]))
        return torch.stack(outputs, dim=1)[..., : 4 * h_in, : 4 * w_in]


__all__ = ["BasicVSR", "ConvResidualBlocks", "EDVRFeatureExtractor", "IconVSR", "clip_flows",
           "temporal_pad_indices"]


def _recognise_basicvsr(s: StateShapes) -> dict | None:
    """BasicVSR from its tensors (SpyNet included): width from the fusion conv, depth from the forward trunk."""
    if s.has_prefix("edvr."):
        return None  # IconVSR
    return {"num_feat": s.dim("fusion.weight", 0), "num_block": s.count("forward_trunk.main.2.")}


def _recognise_iconvsr(s: StateShapes) -> dict:
    """IconVSR from its tensors (SpyNet and the EDVR keyframe branch included): width and depth as BasicVSR's, the
    temporal padding from how many frames the EDVR branch fuses (``2 * temporal_padding + 1``); the keyframe
    stride changes no tensor (the published 5 is kept)."""
    feat = s.dim("backward_fusion.weight", 0)
    frames = s.dim("edvr.fusion.feat_fusion.weight", 1) // feat
    return {"num_feat": feat, "num_block": s.count("forward_trunk.main.2."), "temporal_padding": (frames - 1) // 2}


register_recogniser("BasicVSR", _recognise_basicvsr)
register_recogniser("IconVSR", _recognise_iconvsr)
