"""LPIPS (Zhang et al., 2018): learned perceptual distance, equal to the ``lpips`` package (version 0.1).

``LPIPS(net)`` compares two batches of RGB images **on [0, 1]** (the ``lpips`` package and BasicSR's script
take [-1, 1]; this module maps ``x -> 2x - 1`` itself, so pass ``(t + 1) / 2`` if you hold [-1, 1] tensors):

1. the [-1, 1] input is shifted and scaled per channel (``scaling_layer``, version 0.1);
2. AlexNet (``net='alex'``) or VGG16 (``net='vgg'``) features after each of five ReLU stages, on both images;
3. each feature map is unit-normalised along channels (``f / (||f|| + 1e-10)``), the squared difference is
   weighted per channel by the learned head ``lin<k>`` (a bias-free 1x1 convolution) and averaged over space;
4. the five stage values are summed: one distance per image pair, a tensor ``(N,)``. Lower is better.

Weights come from the caller as state dicts (this module reads no files): the backbone in torchvision's layout
(``features.N.weight`` of ``alexnet()`` / ``vgg16()``) plus the head from the lpips package
(``weights/v0.1/{alex,vgg}.pth``: ``lin{k}.model.1.weight``), or one combined ``lpips.LPIPS`` state dict
(``net.slice{k}.N.weight``, ``lin{k}.model.1.weight``, ``scaling_layer.*``), whose names this module shares.
Static shapes, no host sync; the distances are formed in float32 even under autocast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from anysr.errors import CheckpointError, DataError, OptionError
from anysr.metrics.backbones import (
    ALEXNET_SLICES,
    VGG16_SLICES,
    FrozenMetricNet,
    alexnet_layers,
    build_slices,
    run_slices,
    split_torchvision_keys,
    torchvision_to_sliced,
    vgg16_layers,
)
from anysr.metrics.info import LPIPS_INFO

__all__ = ["LPIPS", "lpips_state_dict", "METRIC_INFO", "BETTER"]

METRIC_INFO = LPIPS_INFO
BETTER = METRIC_INFO.better

_NETS: dict[str, tuple[Callable[[], list[nn.Module]], tuple[int, ...], tuple[int, ...]]] = {
    "alex": (alexnet_layers, ALEXNET_SLICES, (64, 192, 384, 256, 256)),
    "vgg": (vgg16_layers, VGG16_SLICES, (64, 128, 256, 512, 512)),
}
_ALIASES = {"alex": "alex", "alexnet": "alex", "vgg": "vgg", "vgg16": "vgg"}
_EPS = 1e-10


class _SlicedNet(nn.Module):
    """The backbone as ``slice1`` ... ``slice5`` (the lpips package's layout)."""

    def __init__(self, slices: list[nn.Sequential]) -> None:
        super().__init__()
        for k, block in enumerate(slices, start=1):
            self.add_module(f"slice{k}", block)

    def forward(self, x: Tensor) -> list[Tensor]:
        return run_slices(x, list(self.children()))


class _ScalingLayer(nn.Module):
    """Per-channel ``(x - shift) / scale`` of a [-1, 1] input (LPIPS v0.1)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.shift) / self.scale


class _LinHead(nn.Module):
    """One stage's channel weights, stored as lpips stores them: ``model.1.weight`` of shape (1, C, 1, 1)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        # Index 0 is the package's training-time dropout; nothing to hold (and no randomness) in a metric.
        self.model = nn.Sequential(nn.Identity(), nn.Conv2d(channels, 1, 1, bias=False))

    def forward(self, sq_diff: Tensor) -> Tensor:
        """Channel-weighted sum of ``sq_diff`` (float32 elementwise, so autocast leaves it alone) -> (N, H, W)."""
        w = self.model[1].weight.to(torch.float32)
        return (sq_diff * w).sum(dim=1)


def _unit(f: Tensor) -> Tensor:
    return f / (f.square().sum(dim=1, keepdim=True).sqrt() + _EPS)


class LPIPS(FrozenMetricNet):
    """LPIPS distance between two batches of RGB images on [0, 1] -> tensor ``(N,)`` (lower is better).

    ``net``: ``'alex'`` (the paper's default) or ``'vgg'``; ``version``: ``'0.1'`` (the only one supported;
    the first release, 0.0, had no input scaling and other heads). ``backbone`` / ``head``: state dicts as described in
    the module docstring (give both, or neither and call ``load_weights`` later). The state dict is the lpips
    package's, heads listed twice (``lin{k}.*`` and ``lins.{k}.*``) as there, so a saved ``lpips.LPIPS``
    state dict loads with ``load_state_dict(strict=True)``. Parameters are frozen; always in eval mode.
    """

    def __init__(self, net: str = "alex", version: str = "0.1", backbone: Mapping[str, Tensor] | None = None,
                 head: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        key = _ALIASES.get(str(net).lower())
        if key is None:
            raise OptionError(f"net: LPIPS supports 'alex' and 'vgg', got {net!r}")
        if str(version) != "0.1":
            raise OptionError(f"version: LPIPS supports '0.1' (the lpips package's default), got {version!r}")
        self.pnet_type = key
        self.version = str(version)
        make_layers, bounds, self.chns = _NETS[key]
        self.scaling_layer = _ScalingLayer()
        self.net = _SlicedNet(build_slices(make_layers(), bounds))
        heads = [_LinHead(c) for c in self.chns]
        for k, head_k in enumerate(heads):
            self.add_module(f"lin{k}", head_k)
        self.lins = nn.ModuleList(heads)
        self.freeze()
        if backbone is not None or head is not None:
            self.load_weights(*(sd for sd in (backbone, head) if sd is not None))

    def load_weights(self, *state_dicts: Mapping[str, Tensor]) -> LPIPS:
        """Load the backbone and head from one or more state dicts in any layout ``lpips_state_dict``
        accepts (torchvision backbone + lpips head, or one combined lpips state dict); every parameter must
        be covered."""
        merged: dict[str, Tensor] = {}
        for sd in state_dicts:
            merged.update(lpips_state_dict(sd, net=self.pnet_type))
        for name in ("shift", "scale"):
            merged.setdefault(f"scaling_layer.{name}", getattr(self.scaling_layer, name))
        for k in range(len(self.chns)):
            if f"lin{k}.model.1.weight" in merged:
                merged[f"lins.{k}.model.1.weight"] = merged[f"lin{k}.model.1.weight"]
        missing = [k for k in self.state_dict() if k not in merged and not k.startswith("lins.")]
        backbone = "alexnet" if self.pnet_type == "alex" else "vgg16"
        self.load_checked(merged, missing, f"LPIPS({self.pnet_type})",
                          f"give torchvision's {backbone} state dict (features.N.*) and the lpips head "
                          f"(weights/v{self.version}/{self.pnet_type}.pth)")
        return self

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape != y.shape or x.shape[1] != 3:
            raise DataError(f"LPIPS: expected two RGB batches (N, 3, H, W) of the same shape on [0, 1], got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}")
        n = x.shape[0]
        inp = self.scaling_layer(torch.cat([x, y]) * 2 - 1)
        total = None
        for feat, lin in zip(self.net(inp), self.lins):
            f = _unit(feat.to(torch.float32))
            value = lin((f[:n] - f[n:]).square()).mean(dim=(1, 2))
            total = value if total is None else total + value
        assert total is not None
        return total


def lpips_state_dict(state_dict: Mapping[str, Tensor], net: str | None = None) -> dict[str, Tensor]:
    """Rename a state dict to ``LPIPS``'s (the lpips package's) keys.

    Accepted: torchvision ``features.N.*`` (``classifier.*`` dropped; needs ``net``), lpips heads
    ``lin{k}.model.1.weight`` (or ``lin{k}.model.0.weight`` from a head trained without dropout), combined
    ``net.slice{k}.N.*`` / ``scaling_layer.*`` / ``lins.{k}.*`` keys, each optionally behind ``module.``.
    """
    out: dict[str, Tensor] = {}
    tv, rest = split_torchvision_keys(state_dict)
    for key, k, value in rest:
        if k.startswith("lins."):
            continue  # the package's second copy of the heads; lin{k} holds the same tensors
        elif k.startswith("lin") and k[3:4].isdigit():
            idx, tail = k[3:].split(".", 1)
            if tail == "model.0.weight" and value.dim() == 4:
                tail = "model.1.weight"
            out[f"lin{idx}.{tail}"] = value
        elif k.startswith(("net.slice", "scaling_layer.")):
            out[k] = value
        else:
            raise CheckpointError(f"LPIPS weights: unexpected key {key!r}; expected torchvision features.N.*, "
                                  "lpips lin{k}.model.1.weight or net.slice{k}.N.* keys")
    if tv:
        name = _ALIASES.get(str(net).lower()) if net is not None else None
        if name is None:
            raise OptionError("LPIPS weights: a torchvision backbone state dict needs net='alex' or 'vgg'")
        out.update(torchvision_to_sliced(tv, _NETS[name][1], "net.slice", f"LPIPS({name}) backbone"))
    return out
