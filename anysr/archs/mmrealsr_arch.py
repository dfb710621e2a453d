"""MMRealSR (Mou et al., "Metric Learning based Interactive Modulation for Real-World Super-Resolution", ECCV 2022):
ESRGAN's RRDB trunk whose every block is modulated (``(1 + gamma) * x + beta``) by an embedding of degradation
degrees that a small ResNet (``de_net``) estimates from the input, one degree per degradation (blur and noise in
the released models), in [0, 1].

Layer names follow the authors' inference network ``MMRRDBNet_test`` (as in spandrel 0.4.2), so released
checkpoints load with ``strict=True``. ``forward(x)`` returns the image (spandrel's call does the same);
``forward_with_degrees`` also returns the estimated degrees, (b, num_degradation). ``custom_degrees`` sets some
degrees by hand instead of the estimate (the paper's interactive modulation: e.g. ``[null, 0.2]`` keeps the
estimated blur and asks for little denoising), as the reference's ``forward(x, custom_degrees)``.

At x2 and x1 the input is pixel-unshuffled (as ESRGAN's x2 / x1) and the degree estimator reads the unshuffled
input too: its first convs take that many channels in the reference's layout (the reference passes the raw image
to them and cannot run at these scales); sides are padded to a multiple of 2 / 4 (reflect) and the output cropped.

Training (``MMRealSRNetModel`` / ``MMRealSRGANModel``, :mod:`anysr.models.mmrealsr`) calls ``forward(lq, anchor)``,
the authors' training network ``MMRRDBNet(x, anchor=...)``: several LQ versions of each GT plus two anchors (the
clean and the most degraded version) in one batch, the anchors steering the trunk with degrees pinned to 0 and 1;
the estimated degrees come back for the metric-learning losses. ``freeze_estimator`` is the authors'
``MMRRDBNet_decouple`` (their GAN stage): the estimator runs without gradients (and its weights do not train).
The authors' class names are presets: ``MMRRDBNet``, ``MMRRDBNet_test``, ``MMRRDBNet_decouple``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    ResidualBlockNoBN,
    default_init_weights,
    nearest_upsample,
    pad_to_multiple,
    pixel_unshuffle,
)
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.archs.rrdbnet_arch import RRDB
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

EMBED_DIM = 512  # the degree embedding's width: fixed in the authors' code


class AffineModulate(nn.Module):
    """``(1 + gamma) * x + beta`` with per-channel gamma, beta from the degree embedding through a 3-layer MLP."""

    def __init__(self, num_feat: int) -> None:
        super().__init__()
        hidden = (EMBED_DIM + num_feat * 2) // 2
        self.fc = nn.Sequential(nn.Linear(EMBED_DIM, hidden), nn.ReLU(True), nn.Linear(hidden, hidden),
                                nn.ReLU(True), nn.Linear(hidden, num_feat * 2))
        default_init_weights(self.fc, 0.1)

    def forward(self, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(d)[:, :, None, None].chunk(2, dim=1)
        return (1 + gamma) * x + beta


class DEResNet(nn.Module):
    """The degree estimator: per degradation, a conv, residual stages (a stride-2 conv after a stage of
    downscale 2; a 1-stride conv where the width changes after a stage of downscale 1), global average pooling
    and an MLP to one degree through a sigmoid (or tanh)."""

    def __init__(self, num_in_ch: int, num_degradation: int, degradation_degree_actv: str,
                 num_feats: Sequence[int], num_blocks: Sequence[int], downscales: Sequence[int]) -> None:
        super().__init__()
        stages = len(num_feats)
        self.conv_first = nn.ModuleList(nn.Conv2d(num_in_ch, num_feats[0], 3, 1, 1) for _ in range(num_degradation))
        bodies = []
        for _ in range(num_degradation):
            layers: list[nn.Module] = []
            for s in range(stages):
                layers += [ResidualBlockNoBN(num_feats[s]) for _ in range(num_blocks[s])]
                nxt = num_feats[min(s + 1, stages - 1)]
                if downscales[s] == 2:
                    layers.append(nn.Conv2d(num_feats[s], nxt, 3, 2, 1))
                elif s < stages - 1 and num_feats[s] != nxt:
                    layers.append(nn.Conv2d(num_feats[s], nxt, 3, 1, 1))
            bodies.append(nn.Sequential(*layers))
        self.body = nn.ModuleList(bodies)
        actv = nn.Sigmoid if degradation_degree_actv == "sigmoid" else nn.Tanh
        self.fc_degree = nn.ModuleList(
            nn.Sequential(nn.Linear(num_feats[-1], 512), nn.ReLU(True), nn.Linear(512, 1), actv())
            for _ in range(num_degradation))
        default_init_weights([self.conv_first, self.body, self.fc_degree], 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, num_degradation) degrees."""
        return torch.cat([fc(body(conv(x)).mean(dim=(2, 3)))
                          for conv, body, fc in zip(self.conv_first, self.body, self.fc_degree, strict=True)], dim=1)


@ARCH_REGISTRY.register()
class MMRealSR(nn.Module):
    """MMRealSR's network (the authors' ``MMRRDBNet_test``), their arguments and keys.

    Args:
        num_in_ch / num_out_ch: image channels. scale: 4, 2 or 1. num_feat / num_block / num_grow_ch: the RRDB
        trunk (64, 23, 32). de_net_type: ``DEResNet`` (the only one). num_degradation: degrees estimated (2).
        degradation_degree_actv: ``sigmoid`` or ``tanh``. num_feats / num_blocks / downscales: the estimator's
        stages. custom_degrees: per degradation a degree in [0, 1] to use instead of the estimate, or None.
        freeze_estimator: the estimator runs without gradients and does not train (the authors' MMRRDBNet_decouple).
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, scale: int = 4, num_feat: int = 64,
                 num_block: int = 23, num_grow_ch: int = 32, de_net_type: str = "DEResNet", num_degradation: int = 2,
                 degradation_degree_actv: str = "sigmoid", num_feats: Sequence[int] = (64, 128, 256, 512),
                 num_blocks: Sequence[int] = (2, 2, 2, 2), downscales: Sequence[int] = (2, 2, 2, 1),
                 custom_degrees: Sequence[float | None] | None = None, freeze_estimator: bool = False) -> None:
        super().__init__()
        if scale not in (1, 2, 4):
            raise ArchArgumentError("scale", f"MMRealSR upscales x4 (x2 / x1 through pixel unshuffle), got {scale!r}")
        if de_net_type != "DEResNet":
            raise ArchArgumentError("de_net_type", f"MMRealSR's degree estimator is 'DEResNet', got {de_net_type!r}")
        if degradation_degree_actv not in ("sigmoid", "tanh"):
            raise ArchArgumentError("degradation_degree_actv", f"one of sigmoid, tanh; got {degradation_degree_actv!r}")
        if not len(num_feats) == len(num_blocks) == len(downscales) or not num_feats:
            raise ArchArgumentError("num_feats", "MMRealSR's estimator needs one num_feats, num_blocks and downscales "
                                    f"per stage, got {list(num_feats)}, {list(num_blocks)}, {list(downscales)}")
        if any(d not in (1, 2) for d in downscales):
            raise ArchArgumentError("downscales", f"each stage downscales by 1 or 2, got {list(downscales)}")
        custom = list(custom_degrees) if custom_degrees is not None else [None] * num_degradation
        if len(custom) != num_degradation or any(
                d is not None and (isinstance(d, bool) or not isinstance(d, (int, float))) for d in custom):
            raise ArchArgumentError("custom_degrees", f"one number or null per degradation ({num_degradation}), got "
                                    f"{custom_degrees!r}")
        low = -1.0 if degradation_degree_actv == "tanh" else 0.0  # the estimator's range: the trunk knows no other
        if any(d is not None and not low <= float(d) <= 1.0 for d in custom):  # NaN fails too
            raise ArchArgumentError("custom_degrees", f"each degree lies in [{low:g}, 1] (the "
                                    f"{degradation_degree_actv} estimator's range; 1 the strongest), got "
                                    f"{custom_degrees!r}")
        self.scale = scale
        self.num_in_ch = num_in_ch  # what it reads (the first conv reads the unshuffled input at x2 / x1)
        self.unshuffle = {4: 1, 2: 2, 1: 4}[scale]
        self.tile_multiple = self.unshuffle
        self.num_degradation = num_degradation
        self.custom_degrees = custom
        in_ch = num_in_ch * self.unshuffle**2
        self.conv_first = nn.Conv2d(in_ch, num_feat, 3, 1, 1)
        self.body = nn.ModuleList(RRDB(num_feat, num_grow_ch) for _ in range(num_block))
        self.am_list = nn.ModuleList(AffineModulate(num_feat) for _ in range(num_block))
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.de_net = DEResNet(in_ch, num_degradation, degradation_degree_actv, num_feats, num_blocks, downscales)
        self.dd_embed = nn.Sequential(nn.Linear(num_degradation, EMBED_DIM), nn.ReLU(True))
        default_init_weights(self.dd_embed, 0.1)
        self.freeze_estimator = bool(freeze_estimator)
        if self.freeze_estimator:
            self.de_net.requires_grad_(False)

    def _estimate(self, x: torch.Tensor) -> torch.Tensor:
        if self.freeze_estimator:
            with torch.no_grad():
                return self.de_net(x)
        return self.de_net(x)

    def _steer(self, degrees: torch.Tensor) -> torch.Tensor:
        """The degrees that steer the trunk: ``custom_degrees`` where set, else ``degrees``."""
        if not any(d is not None for d in self.custom_degrees):
            return degrees
        return torch.stack([torch.full_like(degrees[:, i], float(d)) if d is not None else degrees[:, i]
                            for i, d in enumerate(self.custom_degrees)], dim=1)

    def _restore(self, x: torch.Tensor, steer: torch.Tensor, h: int, w: int) -> torch.Tensor:
        embedding = self.dd_embed(steer)
        feat = self.conv_first(x)
        trunk = feat
        for block, modulate in zip(self.body, self.am_list, strict=True):
            trunk = modulate(block(trunk), embedding)
        feat = feat + self.conv_body(trunk)
        feat = F.leaky_relu(self.conv_up1(nearest_upsample(feat, 2)), 0.2)
        feat = F.leaky_relu(self.conv_up2(nearest_upsample(feat, 2)), 0.2)
        out = self.conv_last(F.leaky_relu(self.conv_hr(feat), 0.2))
        return out[..., : h * self.scale, : w * self.scale]

    def _unshuffled(self, x: torch.Tensor) -> torch.Tensor:
        if self.unshuffle > 1:
            x = pixel_unshuffle(pad_to_multiple(x, self.unshuffle)[0], self.unshuffle)
        return x

    def forward_with_degrees(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The image and the estimated degrees (b, num_degradation); ``custom_degrees`` replace the estimates
        that steer the trunk, not the ones returned."""
        h, w = x.shape[-2:]
        x = self._unshuffled(x)
        degrees = self._estimate(x)
        return self._restore(x, self._steer(degrees), h, w), degrees

    def forward_anchored(self, lq: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The authors' training forward: ``lq`` (b, n, c, h, w), n LQ versions of each GT, and ``anchor``
        (b, 2, c, h, w), its clean and its most degraded version, run as one batch of b * (n + 2) images in that
        order. The LQs steer the trunk with their estimated degrees, the anchors with degrees pinned to 0 and 1
        (``custom_degrees`` still override both). Returns the images (b * (n + 2), c, H, W) and the estimated
        degrees (b, n + 2, num_degradation), the anchors' included (the anchor losses read them)."""
        if lq.dim() != 5 or anchor.dim() != 5 or anchor.shape[1] != 2 or lq.shape[0] != anchor.shape[0] \
                or lq.shape[2:] != anchor.shape[2:]:
            raise ValueError(f"MMRealSR.forward(lq, anchor): lq (b, n, c, h, w) and anchor (b, 2, c, h, w) of one "
                             f"size, got {tuple(lq.shape)} and {tuple(anchor.shape)}")
        b, n = lq.shape[:2]
        h, w = lq.shape[-2:]
        x = self._unshuffled(torch.cat([lq, anchor], dim=1).flatten(0, 1))
        degrees = self._estimate(x).view(b, n + 2, self.num_degradation)
        pins = torch.tensor([0.0, 1.0], dtype=degrees.dtype, device=degrees.device)
        pinned = torch.cat([degrees[:, :n], pins.view(1, 2, 1).expand(b, 2, self.num_degradation)], dim=1)
        return self._restore(x, self._steer(pinned.flatten(0, 1)), h, w), degrees

    def forward(self, x: torch.Tensor, anchor: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The image; with ``anchor`` (training), :meth:`forward_anchored`'s images and degrees."""
        if anchor is not None:
            return self.forward_anchored(x, anchor)
        return self.forward_with_degrees(x)[0]


__all__ = ["MMRealSR"]


def _estimator_stages(s: StateShapes) -> tuple[list[int], list[int], list[int]]:
    """The estimator's stages from ``de_net.body.0``'s layers: residual blocks (``conv1``) grouped by width, a
    plain conv ending a stage (read as a downscale of 2: a stride leaves no trace in the tensors; a 1-stride conv
    between widths is the same tensor)."""
    feats: list[int] = []
    blocks: list[int] = []
    downs: list[int] = []
    width, count = None, 0
    for i in s.indices("de_net.body.0."):
        if f"de_net.body.0.{i}.conv1.weight" in s:
            w = s.dim(f"de_net.body.0.{i}.conv1.weight", 0)
            if width is not None and w != width:  # a new width without a conv between: a stage of downscale 1
                feats.append(width)
                blocks.append(count)
                downs.append(1)
                count = 0
            width, count = w, count + 1
        elif f"de_net.body.0.{i}.weight" in s:
            if width is None:
                raise NotThisFamily("an estimator stage without residual blocks")
            feats.append(width)
            blocks.append(count)
            downs.append(2)
            width, count = None, 0
    if width is not None:
        feats.append(width)
        blocks.append(count)
        downs.append(1)
    if not feats:
        raise NotThisFamily("no estimator stages")
    return feats, blocks, downs


def _recognise(s: StateShapes) -> dict:
    """MMRealSR from its tensors: output channels and width from ``conv_last``, input channels and scale from
    ``conv_first`` (x2 / x1 read 4x / 16x the output channels), trunk depth and growth, degradations from the
    embedding, the estimator's stages. ``degradation_degree_actv`` changes no tensor (sigmoid, as released)."""
    out_ch, num_feat = s.dim("conv_last.weight", 0), s.dim("conv_last.weight", 1)
    combined = s.dim("conv_first.weight", 1)
    in_ch, scale = combined, 4
    for factor, sc in ((16, 1), (4, 2)):
        if combined == factor * out_ch:
            in_ch, scale = out_ch, sc
    feats, blocks, downs = _estimator_stages(s)
    return {"num_in_ch": in_ch, "num_out_ch": out_ch, "scale": scale, "num_feat": num_feat,
            "num_block": s.count("body."), "num_grow_ch": s.dim("body.0.rdb1.conv1.weight", 0),
            "num_degradation": s.dim("dd_embed.0.weight", 1), "num_feats": feats, "num_blocks": blocks,
            "downscales": downs}


register_recogniser("MMRealSR", _recognise)


# The released MMRealSRNet / MMRealSRGAN (x4) are the class's defaults; the file's top-level scale goes to ``scale``.
# The authors' class names: MMRRDBNet (training), MMRRDBNet_test (inference: the same network here) and
# MMRRDBNet_decouple (their GAN stage: the estimator frozen); their option files pass the arguments.
register_presets("MMRealSR", scale_arg="scale", source="the MMRealSR authors",
                 presets={"mmrealsr": {}, "MMRRDBNet": {}, "MMRRDBNet_test": {},
                          "MMRRDBNet_decouple": {"freeze_estimator": True}})
