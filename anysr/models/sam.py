"""Friendly sharpness-aware minimisation (neosr's ``train.sam: fsam``; Li et al. 2024, arXiv:2403.12350).

Each generator step from ``train.sam_init`` on: with the gradients ``g`` at the weights ``w``, FSAM takes out
``sigma`` times a running mean ``m`` of past gradients (``g <- g - sigma m``, then ``m <- lmbda m + (1 - lmbda)
g_before``; the first step only sets ``m = g``), moves the weights to ``w + e`` with ``e = w^2 g rho / (||
|w| g ||_2 + 1e-12)`` (adaptive SAM), and the model backpropagates again there; the weights go back to ``w`` and the
generator's own optimiser steps with those second gradients. neosr's constants: rho 0.5, sigma 1, lmbda 0.9.

Everything stays on the device (foreach ops, no host read); the momentum is part of the model's training state.
"""

from __future__ import annotations

from typing import Any

import torch

SAM_TYPES = ("fsam",)


class FriendlySAM:
    """FSAM's state over a fixed list of parameters: the gradient momentum and the weights saved while perturbed."""

    def __init__(self, params: list[torch.Tensor], rho: float = 0.5, sigma: float = 1.0, lmbda: float = 0.9,
                 adaptive: bool = True) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.rho, self.sigma, self.lmbda, self.adaptive = float(rho), float(sigma), float(lmbda), bool(adaptive)
        self.momentum: list[torch.Tensor | None] = [None] * len(self.params)
        self._saved: list[torch.Tensor] = []
        self._moved: list[torch.Tensor] = []

    @torch.no_grad()
    def perturb(self) -> None:
        """Update the momentum, take it out of the gradients and move the weights to ``w + e`` (saving ``w``)."""
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not idx:
            return
        ps = [self.params[i] for i in idx]
        grads: list[torch.Tensor] = [p.grad for p in ps]  # type: ignore[misc]
        fresh = [i for i in idx if self.momentum[i] is None]
        for i in fresh:
            self.momentum[i] = self.params[i].grad.clone()  # type: ignore[union-attr]
        old = [k for k, i in enumerate(idx) if i not in fresh]
        if old:
            g = [grads[k] for k in old]
            m: list[torch.Tensor] = [self.momentum[idx[k]] for k in old]  # type: ignore[misc]
            before = torch._foreach_mul(g, 1 - self.lmbda)
            torch._foreach_sub_(g, torch._foreach_mul(m, self.sigma))
            torch._foreach_mul_(m, self.lmbda)
            torch._foreach_add_(m, before)
        weighted = torch._foreach_mul(torch._foreach_abs(ps), grads) if self.adaptive else grads
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(weighted)), ord=2)
        scale = self.rho / (norm + 1e-12)
        step = torch._foreach_mul(torch._foreach_mul(ps, ps), grads) if self.adaptive else \
            [g.clone() for g in grads]
        torch._foreach_mul_(step, scale)
        self._saved = [p.clone() for p in ps]
        self._moved = ps
        torch._foreach_add_(ps, step)

    @torch.no_grad()
    def restore(self) -> None:
        """Put back the weights ``perturb`` saved (bit-exact)."""
        if self._moved:
            torch._foreach_copy_(self._moved, self._saved)
        self._saved, self._moved = [], []

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": list(self.momentum)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        momentum = list(state["momentum"])
        if len(momentum) != len(self.params):
            raise ValueError(f"FSAM state: {len(momentum)} momentum buffers for {len(self.params)} parameters")
        self.momentum = [None if m is None else m.to(device=p.device, dtype=p.dtype).clone()
                         for m, p in zip(momentum, self.params)]
