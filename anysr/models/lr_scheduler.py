"""Learning-rate schedules as pure functions of the iteration, so resuming restores them exactly."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import torch

from anysr.errors import OptionError
from anysr.registry import SCHEDULER_REGISTRY, plain_options


class IterScheduler:
    """Sets every param group's lr to ``initial_lr * factor(iteration)`` (iterations count from 1).

    ``warmup_iter > 0`` scales the lr linearly over the first iterations (as BasicSR does).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_iter: int = -1) -> None:
        self.optimizer = optimizer
        self.warmup_iter = warmup_iter
        self.base_lrs = [float(g.setdefault("initial_lr", g["lr"])) for g in optimizer.param_groups]
        self.last_iter = 0

    def factor(self, it: int) -> float:
        """The schedule's multiplier at iteration ``it`` (1 = no change)."""
        del it
        return 1.0

    def lr_at(self, it: int) -> list[float]:
        f = self.factor(it)
        if 0 < self.warmup_iter and it < self.warmup_iter:
            f *= it / self.warmup_iter
        return [base * f for base in self.base_lrs]

    def step_to(self, it: int) -> None:
        """Set the lr for iteration ``it``."""
        self.last_iter = it
        for group, lr in zip(self.optimizer.param_groups, self.lr_at(it)):
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_iter": self.last_iter, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.step_to(int(state["last_iter"]))


class ConstantLR(IterScheduler):
    """No decay (warm-up only)."""


@SCHEDULER_REGISTRY.register()
class MultiStepLR(IterScheduler):
    """Multiply by ``gamma`` at each milestone (torch MultiStepLR semantics on iterations)."""

    def __init__(self, optimizer: torch.optim.Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = float(gamma)

    def factor(self, it: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, it)


@SCHEDULER_REGISTRY.register()
class CosineAnnealingRestartLR(IterScheduler):
    """Cosine annealing with restarts (BasicSR's ``periods`` / ``restart_weights`` / ``eta_min``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, periods: Sequence[int],
                 restart_weights: Sequence[float] | None = None, eta_min: float = 0.0, warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        self.periods = [int(p) for p in periods]
        self.restart_weights = [float(w) for w in restart_weights] if restart_weights else [1.0] * len(self.periods)
        if len(self.periods) != len(self.restart_weights):
            raise OptionError("train.scheduler: periods and restart_weights must have the same length "
                              f"({len(self.periods)} vs {len(self.restart_weights)})")
        self.eta_min = float(eta_min)
        self.cumulative = [sum(self.periods[: i + 1]) for i in range(len(self.periods))]

    def lr_at(self, it: int) -> list[float]:
        idx = min(bisect.bisect_left(self.cumulative, it), len(self.periods) - 1)
        start = 0 if idx == 0 else self.cumulative[idx - 1]
        weight, period = self.restart_weights[idx], self.periods[idx]
        cos = 0.5 * (1 + math.cos(math.pi * (it - start) / period)) if period else 1.0
        lrs = [self.eta_min + weight * (base - self.eta_min) * cos for base in self.base_lrs]
        if 0 < self.warmup_iter and it < self.warmup_iter:
            lrs = [base * it / self.warmup_iter for base in self.base_lrs]
        return lrs


def build_scheduler(optimizer: torch.optim.Optimizer, opt: Any | None, warmup_iter: int = -1) -> IterScheduler:
    """The schedule named by ``train.scheduler.type`` (SCHEDULER_REGISTRY; none: constant lr)."""
    if not opt:
        return ConstantLR(optimizer, warmup_iter)
    kwargs = plain_options(opt)
    cls = SCHEDULER_REGISTRY.get(kwargs.pop("type"), "train.scheduler.type")
    return cls(optimizer, warmup_iter=warmup_iter, **kwargs)  # type: ignore[no-any-return]
