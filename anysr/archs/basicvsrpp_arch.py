"""BasicVSR++: second-order grid propagation with flow-guided deformable alignment (Chan et al., 2022).

Module names follow BasicSR 1.4.2 (``basicsr/archs/basicvsrpp_arch.py``), so its checkpoints load with
``strict=True`` and give its outputs. Differences from BasicSR, none of which changes a result it can compute:

* the deformable alignment always exists and runs on any device (anysr's pure DCNv2); BasicSR builds it only
  when CUDA is available and otherwise silently skips alignment;
* both flow directions are always computed. BasicSR skips one for mirror-extended clips (the result is the same)
  with a data-dependent test that needs a host sync, and keeps that flag for every later clip;
* ``cpu_cache_length`` is accepted but features are never moved to the CPU (architectures do not manage
  devices); split very long clips instead;
* BasicSR refuses low-resolution inputs smaller than 64x64 (where SPyNet's flow gets poor); here they run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, flow_warp, refuse_weights_path
from anysr.archs.basicvsr_arch import ConvResidualBlocks, check_frames
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.spynet_arch import SpyNet
from anysr.ops.dcn import ModulatedDeformConv2d
from anysr.registry import ARCH_REGISTRY

BRANCHES = ("backward_1", "forward_1", "backward_2", "forward_2")
DEFORMABLE_GROUPS = 16

# PyTorch's bicubic (a = -0.75) downscaling by exactly 4 samples source position 4 * i + 1.5: the four taps
# 4i .. 4i+3 at distances 1.5, 0.5, 0.5, 1.5, all inside the image. As a stride-4 convolution it also lowers on
# XLA, where F.interpolate(mode='bicubic') has no lowering.
_BICUBIC_QUARTER_TAPS = (-0.09375, 0.59375, 0.59375, -0.09375)


def bicubic_quarter(x: torch.Tensor) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=0.25, mode='bicubic')`` of (n, c, h, w) as a depthwise stride-4 conv."""
    n, c, h, w = x.shape
    taps = torch.tensor(_BICUBIC_QUARTER_TAPS, dtype=x.dtype, device=x.device)
    kernel = (taps.view(4, 1) * taps.view(1, 4)).expand(c, 1, 4, 4)
    return F.conv2d(x, kernel, stride=4, groups=c)


class SecondOrderDeformableAlignment(ModulatedDeformConv2d):
    """Flow-guided DCNv2 over [previous feature, feature two steps back]: offsets are the flows (to the
    previous / second-previous frame) plus a residue bounded by ``max_residue_magnitude`` (tanh), predicted by
    ``conv_offset`` from the warped features, the current feature and both flows.

    Takes BasicSR's arguments (``in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
    deformable_groups, bias, max_residue_magnitude``).
    """

    def __init__(self, *args, max_residue_magnitude: float = 10, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_residue_magnitude = max_residue_magnitude
        if self.deformable_groups % 2:
            raise ValueError(f"deformable_groups: {self.deformable_groups} must be even (half of the groups "
                             f"follow each of the two flows)")
        kk = self.kernel_size[0] * self.kernel_size[1]
        c = self.out_channels
        self.conv_offset = nn.Sequential(
            nn.Conv2d(3 * c + 4, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, c, 3, 1, 1),
            nn.LeakyReLU(negative_slope=0.1, inplace=True),
            nn.Conv2d(c, 3 * kk * self.deformable_groups, 3, 1, 1),
        )
        nn.init.zeros_(self.conv_offset[-1].weight)
        nn.init.zeros_(self.conv_offset[-1].bias)

    def forward(self, x: torch.Tensor, extra_feat: torch.Tensor, flow_1: torch.Tensor,  # type: ignore[override]
                flow_2: torch.Tensor) -> torch.Tensor:
        out = self.conv_offset(torch.cat([extra_feat, flow_1, flow_2], dim=1))
        n = out.shape[1] // 3
        residue = self.max_residue_magnitude * torch.tanh(out[:, : 2 * n])
        # Offsets are (group, tap, [dy, dx]); the first half of the groups follows flow_1, the second flow_2.
        # Flows are (dx, dy), hence the flip.
        reps = n // 2
        base = torch.cat([flow_1.flip(1).repeat(1, reps, 1, 1), flow_2.flip(1).repeat(1, reps, 1, 1)], dim=1)
        return self.deform(x, residue + base, torch.sigmoid(out[:, 2 * n:]))


@ARCH_REGISTRY.register()
class BasicVSRPlusPlus(nn.Module):
    """BasicVSR++: (b, t, 3, h, w) -> (b, t, 3, 4h, 4w), or the same size with ``is_low_res_input=False``
    (then h and w must be multiples of 4; flow is estimated on a bicubic quarter-size copy).

    Args:
        mid_channels: feature channels (a multiple of 8: the alignment uses 16 deformable groups over twice
            as many channels). num_blocks: residual blocks per propagation branch.
        max_residue_magnitude: bound of the learned offset residue around the flow.
        is_low_res_input: x4 super-resolution (True) or same-size restoration (False).
        spynet_path: must be None (the engine loads pretrained weights).
        cpu_cache_length: accepted for BasicSR compatibility; ignored (see the module docstring).
    """

    def __init__(self, mid_channels: int = 64, num_blocks: int = 7, max_residue_magnitude: float = 10,
                 is_low_res_input: bool = True, spynet_path: str | None = None, cpu_cache_length: int = 100) -> None:
        super().__init__()
        refuse_weights_path("spynet_path", spynet_path, "SpyNet")
        if not isinstance(mid_channels, int) or mid_channels < 8 or mid_channels % 8:
            raise ArchArgumentError("mid_channels", f"must be a positive multiple of 8 (16 deformable groups over "
                                                    f"2 * mid_channels channels), got {mid_channels!r}")
        self.mid_channels = mid_channels
        self.is_low_res_input = is_low_res_input
        self.cpu_cache_length = cpu_cache_length
        self.spynet = SpyNet()
        if is_low_res_input:
            self.feat_extract: nn.Module = ConvResidualBlocks(3, mid_channels, 5)
        else:
            self.feat_extract = nn.Sequential(
                nn.Conv2d(3, mid_channels, 3, 2, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
                nn.Conv2d(mid_channels, mid_channels, 3, 2, 1), nn.LeakyReLU(negative_slope=0.1, inplace=True),
                ConvResidualBlocks(mid_channels, mid_channels, 5))
        self.deform_align = nn.ModuleDict()
        self.backbone = nn.ModuleDict()
        for i, name in enumerate(BRANCHES):
            self.deform_align[name] = SecondOrderDeformableAlignment(
                2 * mid_channels, mid_channels, 3, padding=1, deformable_groups=DEFORMABLE_GROUPS,
                max_residue_magnitude=max_residue_magnitude)
            self.backbone[name] = ConvResidualBlocks((2 + i) * mid_channels, mid_channels, num_blocks)
        self.reconstruction = ConvResidualBlocks(5 * mid_channels, mid_channels, 5)
        self.upconv1 = nn.Conv2d(mid_channels, mid_channels * 4, 3, 1, 1, bias=True)
        self.upconv2 = nn.Conv2d(mid_channels, 64 * 4, 3, 1, 1, bias=True)
        self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = nn.Conv2d(64, 64, 3, 1, 1)
        self.conv_last = nn.Conv2d(64, 3, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.1, inplace=True)

    def compute_flow(self, lqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flows_forward, flows_backward)``, each (n, t - 1, 2, h, w): ``forward[:, i]`` warps frame i's
        features onto frame i + 1 (propagating forward in time), ``backward[:, i]`` frame i + 1's onto frame i."""
        n, t, c, h, w = lqs.shape
        earlier = lqs[:, :-1].reshape(-1, c, h, w)
        later = lqs[:, 1:].reshape(-1, c, h, w)
        flows_backward = self.spynet(earlier, later).view(n, t - 1, 2, h, w)
        flows_forward = self.spynet(later, earlier).view(n, t - 1, 2, h, w)
        return flows_forward, flows_backward

    def propagate(self, feats: dict[str, list[torch.Tensor]], flows: torch.Tensor,
                  module_name: str) -> dict[str, list[torch.Tensor]]:
        """Run branch ``module_name`` over the clip and store its per-frame features (in frame order) in
        ``feats[module_name]``; earlier branches' features of the same frame are inputs of its backbone."""
        t = len(feats["spatial"])
        order = list(range(t - 1, -1, -1)) if module_name.startswith("backward") else list(range(t))
        # flows[:, j] links frame j and j + 1; going backward, frame idx is reached from idx + 1 by flows[:, idx].
        flow_of = (lambda idx: flows[:, idx]) if module_name.startswith("backward") else (
            lambda idx: flows[:, idx - 1])
        earlier = [k for k in feats if k not in ("spatial", module_name)]
        out: list[torch.Tensor] = []
        feat_prop = flows.new_zeros(flows.shape[0], self.mid_channels, *flows.shape[-2:])
        for i, idx in enumerate(order):
            feat_current = feats["spatial"][idx]
            if i > 0:
                flow_n1 = flow_of(idx)
                cond_n1 = flow_warp(feat_prop, flow_n1.permute(0, 2, 3, 1))
                if i > 1:
                    feat_n2 = out[-2]
                    flow_n2 = flow_of(order[i - 1])
                    flow_n2 = flow_n1 + flow_warp(flow_n2, flow_n1.permute(0, 2, 3, 1))
                    cond_n2 = flow_warp(feat_n2, flow_n2.permute(0, 2, 3, 1))
                else:
                    feat_n2 = torch.zeros_like(feat_prop)
                    flow_n2 = torch.zeros_like(flow_n1)
                    cond_n2 = torch.zeros_like(cond_n1)
                cond = torch.cat([cond_n1, feat_current, cond_n2], dim=1)
                feat_prop = self.deform_align[module_name](torch.cat([feat_prop, feat_n2], dim=1), cond,
                                                           flow_n1, flow_n2)
            feat = torch.cat([feat_current] + [feats[k][idx] for k in earlier] + [feat_prop], dim=1)
            feat_prop = feat_prop + self.backbone[module_name](feat)
            out.append(feat_prop)
        feats[module_name] = out[::-1] if module_name.startswith("backward") else out
        return feats

    def upsample(self, lqs: torch.Tensor, feats: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        """Reconstruct every frame from the spatial and the four branches' features."""
        outputs = []
        for i in range(lqs.shape[1]):
            hr = torch.cat([feats["spatial"][i]] + [feats[k][i] for k in BRANCHES], dim=1)
            hr = self.reconstruction(hr)
            hr = self.lrelu(self.pixel_shuffle(self.upconv1(hr)))
            hr = self.lrelu(self.pixel_shuffle(self.upconv2(hr)))
            hr = self.conv_last(self.lrelu(self.conv_hr(hr)))
            if self.is_low_res_input:
                hr = hr + F.interpolate(lqs[:, i], scale_factor=4, mode="bilinear", align_corners=False)
            else:
                hr = hr + lqs[:, i]
            outputs.append(hr)
        return torch.stack(outputs, dim=1)

    def forward(self, lqs: torch.Tensor) -> torch.Tensor:
        n, t, c, h, w = check_frames("BasicVSRPlusPlus", lqs)
        if self.is_low_res_input:
            lqs_flow = lqs
        else:
            if h % 4 or w % 4:
                raise ValueError(f"BasicVSRPlusPlus(is_low_res_input=False): height and width must be multiples "
                                 f"of 4, got {h}x{w} (pad the frames)")
            lqs_flow = bicubic_quarter(lqs.reshape(n * t, c, h, w)).view(n, t, c, h // 4, w // 4)
        spatial = self.feat_extract(lqs.reshape(n * t, c, h, w))
        spatial = spatial.view(n, t, *spatial.shape[1:])
        feats: dict[str, list[torch.Tensor]] = {"spatial": [spatial[:, i] for i in range(t)]}
        flows_forward, flows_backward = self.compute_flow(lqs_flow)
        for name in BRANCHES:
            feats = self.propagate(feats, flows_backward if name.startswith("backward") else flows_forward, name)
        return self.upsample(lqs, feats)


__all__ = ["BasicVSRPlusPlus", "SecondOrderDeformableAlignment", "bicubic_quarter"]


def _recognise(s: StateShapes) -> dict:
    """BasicVSR++ from its tensors (SpyNet included): width from the first propagation branch, blocks per branch
    from it, x4 (a residual feature extractor) or same-size restoration (two strided convs first)."""
    low_res = "feat_extract.main.0.weight" in s
    return {"mid_channels": s.dim("backbone.backward_1.main.0.weight", 0),
            "num_blocks": s.count("backbone.backward_1.main.2."), "is_low_res_input": low_res}


register_recogniser("BasicVSRPlusPlus", _recognise)
