"""TOFlow: video enhancement with task-oriented flow (Xue et al., IJCV 2019), BasicSR's version.

The seven input frames are already upsampled to the output size; every frame is warped onto the reference frame
with a 4-level SPyNet (with batch norm, working on ImageNet-normalised images) and a small CNN fuses the stack.
Module names follow BasicSR 1.4.2, so its checkpoints (including those converted from the official weights with
``adapt_official_weights``) load with ``strict=True`` and give its outputs.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import flow_warp, refuse_weights_path
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.spynet_arch import IMAGENET_MEAN, IMAGENET_STD, SpyNetBasicModule, pyramid, upsample_flow
from anysr.registry import ARCH_REGISTRY

NUM_FRAMES = 7


class SPyNetTOF(nn.Module):
    """SPyNet of TOFlow: 4 pyramid levels of batch-normalised basic modules, no input normalisation of its own
    (TOFlow normalises), zero padding when warping. ``forward(ref, supp)`` -> (b, 2, h, w) flow in pixels.

    Sides that are not multiples of 16 work too (the upsampled flow repeats its last row / column where a
    level has an odd size); BasicSR needs multiples of 16.
    """

    def __init__(self, load_path: str | None = None) -> None:
        super().__init__()
        refuse_weights_path("load_path", load_path, "SPyNetTOF")
        self.basic_module = nn.ModuleList(SpyNetBasicModule(batch_norm=True) for _ in range(4))

    def forward(self, ref: torch.Tensor, supp: torch.Tensor) -> torch.Tensor:
        refs, supps = pyramid(ref, 4), pyramid(supp, 4)
        b, _, h0, w0 = refs[0].shape
        flow = ref.new_zeros(b, 2, h0, w0)
        for level, (r, s) in enumerate(zip(refs, supps)):
            up = flow if level == 0 else upsample_flow(flow, (r.shape[-2], r.shape[-1]))
            flow = up + self.basic_module[level](torch.cat([r, flow_warp(s, up.permute(0, 2, 3, 1)), up], 1))
        return flow


@ARCH_REGISTRY.register()
class TOFlow(nn.Module):
    """TOFlow: (b, 7, 3, h, w) frames at output size -> (b, 3, h, w) restored reference frame.

    Args:
        adapt_official_weights: weights converted from the official implementation, whose reference frame is
            the first (the frames are reordered so frame 3 comes first). Otherwise frame 3 is the reference.
    """

    def __init__(self, adapt_official_weights: bool = False) -> None:
        super().__init__()
        self.adapt_official_weights = adapt_official_weights
        self.ref_idx = 0 if adapt_official_weights else 3
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))
        self.spynet = SPyNetTOF()
        self.conv_1 = nn.Conv2d(3 * NUM_FRAMES, 64, 9, 1, 4)
        self.conv_2 = nn.Conv2d(64, 64, 9, 1, 4)
        self.conv_3 = nn.Conv2d(64, 64, 1)
        self.conv_4 = nn.Conv2d(64, 3, 1)
        self.relu = nn.ReLU(inplace=True)

    def normalize(self, img: torch.Tensor) -> torch.Tensor:
        return (img - self.mean) / self.std

    def denormalize(self, img: torch.Tensor) -> torch.Tensor:
        return img * self.std + self.mean

    def forward(self, lrs: torch.Tensor) -> torch.Tensor:
        if lrs.dim() != 5 or lrs.shape[1] != NUM_FRAMES or lrs.shape[2] != 3:
            raise ValueError(f"TOFlow: expected {NUM_FRAMES} RGB frames (b, {NUM_FRAMES}, 3, h, w), got shape "
                             f"{tuple(lrs.shape)}")
        if self.adapt_official_weights:
            lrs = lrs[:, [3, 0, 1, 2, 4, 5, 6]]
        b, t, c, h, w = lrs.shape
        lrs = self.normalize(lrs.reshape(b * t, c, h, w)).view(b, t, c, h, w)
        ref = lrs[:, self.ref_idx]
        aligned = []
        for i in range(t):
            if i == self.ref_idx:
                aligned.append(ref)
            else:
                # One SPyNet call per frame, as BasicSR: in training mode its batch norms see this batch only.
                supp = lrs[:, i]
                aligned.append(flow_warp(supp, self.spynet(ref, supp).permute(0, 2, 3, 1)))
        hr = torch.stack(aligned, dim=1).view(b, t * c, h, w)
        hr = self.relu(self.conv_2(self.relu(self.conv_1(hr))))
        hr = self.conv_4(self.relu(self.conv_3(hr))) + ref
        return self.denormalize(hr)


__all__ = ["SPyNetTOF", "TOFlow"]


def _recognise(s: StateShapes) -> dict:
    """TOFlow: one fixed layout (7 RGB frames, its SPyNet, four convs); nothing to infer (whether the weights
    are the official ones, reordered, shows in no tensor: the class's default is proposed)."""
    s.shape("spynet.basic_module.0.basic_module.0.weight")
    s.shape("conv_1.weight")
    return {}


register_recogniser("TOFlow", _recognise)
