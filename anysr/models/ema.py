"""Exponential moving average of a network's weights (BasicSR's ``net_g_ema``)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """Keeps ``ema = decay * ema + (1 - decay) * param`` on the same device; buffers are copied."""

    def __init__(self, net: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        self.module = copy.deepcopy(net).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, net: nn.Module) -> None:
        ema_params = list(self.module.parameters())
        params = [p.detach() for p in net.parameters()]
        torch._foreach_lerp_(ema_params, params, 1.0 - self.decay)
        for b_ema, b in zip(self.module.buffers(), net.buffers()):
            b_ema.copy_(b)
