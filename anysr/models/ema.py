"""Exponential moving average of a network's weights (BasicSR's ``net_g_ema``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from anysr.accelerators.base import device_scalar


class EMA:
    """Keeps ``ema = d * ema + (1 - d) * param`` on the same device; buffers are copied.

    ``d = min(decay, (1 + n) / (10 + n))`` after ``n`` updates: the random initial weights are forgotten within
    the first few hundred steps instead of lingering for ``1 / (1 - decay)`` of them (with decay 0.999, BasicSR's
    plain EMA still holds 37% of the random init after 1000 iterations). For long runs the two are the same.

    traiNNer-redux's schedule (ema-pytorch's) when ``power`` is given: the EMA copies the weights for the first
    ``update_after + 2`` updates, then ``d = min(decay, 1 - (1 + n) ** -power)`` with ``n`` the updates past
    ``update_after``. Without ``power``, ``update_after`` updates copy and anysr's warm-up counts from there.
    ``switch_every``: every that many updates the network takes the EMA weights. ``warmup=False`` (neosr's EMA,
    torch's ``AveragedModel``): the first update past ``update_after`` copies, every later one averages with ``decay``
    itself. Everything depends on the update count alone (saved in the state): exact on resume.
    """

    def __init__(self, net: nn.Module, decay: float, *, power: float | None = None, update_after: int = 0,
                 switch_every: int = 0, warmup: bool = True) -> None:
        if not warmup and power is not None:
            raise ValueError("an EMA without warm-up takes no power (ema_power is a warm-up schedule)")
        self.warmup = bool(warmup)
        self.decay = float(decay)
        self.power = None if power is None else float(power)
        self.update_after = int(update_after)
        self.switch_every = int(switch_every)
        self.updates = 0
        self.module = copy.deepcopy(net).eval().requires_grad_(False)

    def current_decay(self) -> float:
        """The decay of the next update (0: the EMA takes the weights as they are)."""
        n = self.updates - self.update_after
        if not self.warmup:
            return 0.0 if n <= 0 else self.decay
        if self.power is None:
            return 0.0 if n < 0 else min(self.decay, (1 + n) / (10 + n))
        return 0.0 if n <= 1 else min(self.decay, max(0.0, 1.0 - (1.0 + n) ** -self.power))

    @torch.no_grad()
    def update(self, net: nn.Module) -> None:
        ema_params = list(self.module.parameters())
        params = [p.detach() for p in net.parameters()]
        if ema_params:
            self._lerp(ema_params, params, 1.0 - self.current_decay())
        for b_ema, b in zip(self.module.buffers(), net.buffers()):
            b_ema.copy_(b)
        if self.switch_every and self.updates and self.updates % self.switch_every == 0:
            self._lerp(params, ema_params, 1.0)
        self.updates += 1

    @staticmethod
    def _lerp(start: list[torch.Tensor], end: list[torch.Tensor], weight: float) -> None:
        """``start += weight * (end - start)`` in place, the weight a 0-dim tensor on the parameters' device.

        A copy is a lerp by 1 (``end - (end - start) * 0``: exactly ``end``): on XLA ``copy_`` would alias the
        trained weights' buffers, which the next optimizer step gives away. The weight is data to every backend
        (:func:`device_scalar`): XLA's graph builder bakes a Python number of 0 or +-1 in as a constant and sends
        any other as data, so Python-float weights made a warm-up's weight of 1 (or a switch) compile a graph of its
        own.
        """
        by_kind: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, t in enumerate(start):
            by_kind.setdefault((t.device, t.dtype), []).append(i)
        for (device, dtype), idx in by_kind.items():
            w = device_scalar(weight, torch.promote_types(dtype, torch.float32), device)  # as ATen's opmath
            torch._foreach_lerp_([start[i] for i in idx], [end[i] for i in idx], [w] * len(idx))

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["params"])
        self.updates = int(state["updates"])
