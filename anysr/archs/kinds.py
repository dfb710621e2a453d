"""What a network takes in: images, or clips of frames (recurrent: a clip out; window: the centre frame out).

One place for the model layer (an image model refuses a video network) and the inference engine (``anysr infer``
runs a video network over a clip) to ask.
"""

from __future__ import annotations

from torch import nn

from anysr.archs.basicvsr_arch import BasicVSR, IconVSR
from anysr.archs.basicvsrpp_arch import BasicVSRPlusPlus
from anysr.archs.duf_arch import DUF
from anysr.archs.edvr_arch import EDVR
from anysr.archs.tof_arch import TOFlow
from anysr.registry import ARCH_REGISTRY

__all__ = ["RECURRENT_ARCHS", "WINDOW_ARCHS", "arch_kind"]

RECURRENT_ARCHS = (BasicVSR, IconVSR, BasicVSRPlusPlus)
WINDOW_ARCHS = (EDVR, TOFlow, DUF)


def arch_kind(net_or_type: nn.Module | type | str) -> str:
    """'recurrent', 'window' or 'image' for a network, its class or its registered name."""
    cls = net_or_type if isinstance(net_or_type, type) else type(net_or_type)
    if isinstance(net_or_type, str):
        cls = ARCH_REGISTRY.get(net_or_type) if net_or_type in ARCH_REGISTRY else object
    if issubclass(cls, RECURRENT_ARCHS):
        return "recurrent"
    if issubclass(cls, WINDOW_ARCHS) or getattr(cls, "video_window", False):  # clip in, centre frame out
        return "window"
    return "image"
