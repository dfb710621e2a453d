"""neosr's optimizers, under neosr's type names (``adan_sf``, ``adamw_sf``, ``adamw_win``; ``adan`` as
``NeosrAdan``), with neosr's constructor arguments, defaults and state-dict keys, so neosr's option blocks and
optimizer states carry over.

- ``NeosrAdanScheduleFree`` (``adan_sf``): schedule-free Adan as neosr trains with it. Unlike traiNNer-redux's
  ``AdanScheduleFree``, ``z`` follows the plain (clipped) gradient, the decay acts before the interpolation, the
  first-moment step is scaled by the bias correction (not divided), and the averaging weight uses
  ``lr * sqrt(1 - beta3 ** step)``.
- ``NeosrAdamWScheduleFree`` (``adamw_sf``): schedule-free AdamW of schedulefree's early releases (the step size
  carries ``sqrt(1 - beta2 ** k)``, the denominator none), not schedulefree 1.4's ``AdamWScheduleFree``.
- ``NeosrAdan`` (``adan``): Adan (Xie et al. 2022) with ``no_prox`` (decoupled decay, the default) or the proximal
  decay; pytorch-optimizer's ``Adan`` computes the same but takes other arguments and defaults.
- ``AdamWWin`` (``adamw_win``): AdamW with Win / Win2 acceleration (Zhou et al. 2024), or plain AdamW (``none``).

Every step is multi-tensor (``torch._foreach_*``) and reads nothing back to the host: the per-step factors are
Python floats of the step count and the learning rates, and gradient clipping (``max_grad_norm > 0``) stays a device
tensor (neosr reads it to the host). The gradients are left as they are (neosr scales and divides them in place).
neosr's ``schedule_free`` flag (which makes neosr's model call ``train()`` / ``eval()``) is an argument here: it must
be true for the schedule-free ones and false for the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from anysr.models.adan_schedulefree import OptimizerArgumentError, ScheduleFreeSwitch, _number, clip_factor
from anysr.registry import OPTIMIZER_REGISTRY

Params = Iterable[Tensor] | Iterable[dict[str, Any]]


# ---------------------------------------------------------------------------------------------------- checks
def _betas(value: Any, count: int, *, first_positive: bool = False) -> tuple[float, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != count:
        raise OptimizerArgumentError("betas", f"must be {count} numbers, got {value!r}")
    for i, b in enumerate(value):
        _number(f"betas[{i}]", b, 0.0, 1.0, open_low=first_positive and i == 0, open_high=True)
    return tuple(value)


def _flag(arg: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptimizerArgumentError(arg, f"must be true or false, got {value!r}")
    return value


def _schedule_free(value: Any, *, wanted: bool, name: str, instead: str) -> None:
    """neosr's ``schedule_free`` flag: ``wanted`` for this optimizer, else refused, saying which type to use."""
    if _flag("schedule_free", value) != wanted:
        what = "is schedule-free" if wanted else "has no schedule-free mode"
        raise OptimizerArgumentError("schedule_free", f"must be {str(wanted).lower()}: {name} {what}; {instead}")


def _no_warmup(value: Any, name: str) -> None:
    """``warmup_steps`` in a block of an optimizer without one (neosr ignores it for ``adan``): 0 only."""
    if _number("warmup_steps", value, 0.0) != 0:
        raise OptimizerArgumentError("warmup_steps", f"{name} has no warm-up of its own (neosr ignores it); remove "
                                     "it or use train.warmup_iter")


def _with_grads(group: dict[str, Any], clip: Tensor | None) -> tuple[list[Tensor], list[Tensor]]:
    params = [p for p in group["params"] if p.grad is not None]
    grads = [p.grad for p in params]
    if clip is not None and grads:
        grads = list(torch._foreach_mul(grads, clip))
    return params, grads  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------- weight switch
class _WeightSwitch(ScheduleFreeSwitch):
    """neosr's schedule-free optimizers: the weight switch and the averaging weight."""

    @staticmethod
    def _averaging_weight(group: dict[str, Any], step: int, lr: float) -> float:
        """Schedule-free's ``ckp1``: this step's share of the average, from the largest ``lr`` so far."""
        group["lr_max"] = lr_max = max(lr, group["lr_max"])
        weight = step ** group["r"] * lr_max ** group["weight_lr_power"]
        group["weight_sum"] += weight
        return weight / group["weight_sum"] if group["weight_sum"] != 0 else 0.0


# ---------------------------------------------------------------------------------------------------- Adan kernel
def _adan_moments(group: dict[str, Any], states: list[dict[str, Tensor]], grads: list[Tensor],
                  bc3_sqrt: float) -> list[Tensor]:
    """Adan's three moments updated in place (neosr's op order); returns the denominator."""
    beta1, beta2, beta3 = group["betas"]
    m, n, d, diff = ([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "exp_avg_diff", "neg_pre_grad"))
    torch._foreach_add_(diff, grads)  # g_t - g_{t-1}
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, grads, alpha=1 - beta1)
    torch._foreach_mul_(d, beta2)
    torch._foreach_add_(d, diff, alpha=1 - beta2)
    torch._foreach_mul_(diff, beta2)
    torch._foreach_add_(diff, grads)  # g_t + beta2 (g_t - g_{t-1})
    torch._foreach_mul_(n, beta3)
    torch._foreach_addcmul_(n, diff, diff, value=1 - beta3)
    denom = list(torch._foreach_sqrt(n))
    torch._foreach_div_(denom, bc3_sqrt)
    torch._foreach_add_(denom, group["eps"])
    return denom


def _adan_states(opt: torch.optim.Optimizer, params: list[Tensor], grads: list[Tensor], step: int,
                 with_z: bool) -> list[dict[str, Tensor]]:
    states = [opt.state[p] for p in params]
    for p, s in zip(params, states):
        if not s:
            s.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p), exp_avg_diff=torch.zeros_like(p))
            if with_z:
                s["z"] = p.detach().clone()
    fresh = [i for i, s in enumerate(states) if step == 1 or "neg_pre_grad" not in s]
    if fresh:  # the previous gradient of a first step is this one: no difference
        for i, neg in zip(fresh, torch._foreach_neg([grads[i] for i in fresh])):
            states[i]["neg_pre_grad"] = neg
    return states


def _keep_neg_grads(states: list[dict[str, Tensor]], grads: list[Tensor]) -> None:
    """``-g_t`` into the ``neg_pre_grad`` buffers (the next step's previous gradient)."""
    diff = [s["neg_pre_grad"] for s in states]
    torch._foreach_copy_(diff, grads)
    torch._foreach_neg_(diff)


def _adan_args(lr: Any, eps: Any, weight_decay: Any, max_grad_norm: Any) -> None:
    _number("lr", lr, 0.0)
    _number("eps", eps, 0.0)
    _number("weight_decay", weight_decay, 0.0)
    _number("max_grad_norm", max_grad_norm, 0.0)


@OPTIMIZER_REGISTRY.register()
class NeosrAdanScheduleFree(_WeightSwitch):
    """neosr's ``adan_sf``: schedule-free Adan.

    ``lr``: step size; ``betas``: decays of the gradient, gradient-difference and squared-update averages; ``eps``:
    added to the denominator; ``weight_decay``: decoupled, ``lr * weight_decay`` per step; ``max_grad_norm``: clip
    the global gradient norm to it (0: none); ``warmup_steps``: the averaging weight's lr rises linearly over them;
    ``r``: polynomial weighting of the average; ``weight_lr_power``: the average weights each step by the largest lr
    so far to this power; ``schedule_free``: neosr's flag, must be true.
    """

    other_names = ("adan_sf",)

    def __init__(self, params: Params, lr: float = 1.6e-3, betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.02, max_grad_norm: float = 0.0, warmup_steps: int = 0,
                 r: float = 0.0, weight_lr_power: float = 2.0, schedule_free: bool = True) -> None:
        _adan_args(lr, eps, weight_decay, max_grad_norm)
        _number("warmup_steps", warmup_steps, 0.0)
        _number("r", r)
        _number("weight_lr_power", weight_lr_power)
        _schedule_free(schedule_free, wanted=True, name="adan_sf",
                       instead="neosr's adan_sf without it is plain Adan: use type NeosrAdan (neosr's adan)")
        defaults = {"lr": lr, "betas": _betas(betas, 3, first_positive=True), "eps": eps, "r": r,
                    "weight_decay": weight_decay, "max_grad_norm": max_grad_norm, "warmup_steps": warmup_steps,
                    "train_mode": True, "weight_sum": 0.0, "lr_max": -1.0, "weight_lr_power": weight_lr_power,
                    "schedule_free": True}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of every group (in train mode only)."""
        loss = self._begin(closure)
        clip = clip_factor(self, self.defaults["max_grad_norm"], self.param_groups[-1]["eps"])
        for group in self.param_groups:
            beta1, beta2, beta3 = group["betas"]
            step = group["step"] = group.get("step", 0) + 1
            warmup = group["warmup_steps"]
            sched = step / warmup if step < warmup else 1.0
            bc1, bc2, bc3 = 1.0 - beta1 ** step, 1.0 - beta2 ** step, 1.0 - beta3 ** step
            lr = group["lr"]
            ckp1 = self._averaging_weight(group, step, lr * sched * math.sqrt(bc3))
            params, grads = _with_grads(group, clip)
            if not params:
                continue
            states = _adan_states(self, params, grads, step, with_z=True)
            denom = _adan_moments(group, states, grads, math.sqrt(bc3))
            z = [s["z"] for s in states]
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            torch._foreach_lerp_(params, z, ckp1)
            torch._foreach_addcdiv_(params, [s["exp_avg"] for s in states], denom,
                                    value=-(lr * (bc1 * (1 - ckp1))))
            torch._foreach_addcdiv_(params, [s["exp_avg_diff"] for s in states], denom,
                                    value=-(lr * (beta2 / bc2 * (1 - ckp1))))
            torch._foreach_sub_(z, grads, alpha=lr)
            _keep_neg_grads(states, grads)
        return loss


@OPTIMIZER_REGISTRY.register()
class NeosrAdan(torch.optim.Optimizer):
    """neosr's ``adan``: Adan with neosr's defaults.

    ``lr``, ``betas``, ``eps``, ``max_grad_norm`` as ``adan_sf``; ``weight_decay``: with ``no_prox`` (default) the
    weights are scaled by ``1 - lr * weight_decay`` before the step, else divided by ``1 + lr * weight_decay`` after
    it; ``foreach``: accepted, the step is always multi-tensor (the same ops); ``schedule_free`` must be false and
    ``warmup_steps`` 0 (neosr's adan_sf blocks carry them).
    """

    def __init__(self, params: Params, lr: float = 5e-4, betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.02, max_grad_norm: float = 0.0, no_prox: bool = True,
                 foreach: bool = True, schedule_free: bool = False, warmup_steps: int = 0) -> None:
        _adan_args(lr, eps, weight_decay, max_grad_norm)
        _flag("no_prox", no_prox)
        _flag("foreach", foreach)
        _schedule_free(schedule_free, wanted=False, name="adan", instead="use type adan_sf for schedule-free Adan")
        _no_warmup(warmup_steps, "adan")
        defaults = {"lr": lr, "betas": _betas(betas, 3), "eps": eps, "weight_decay": weight_decay,
                    "max_grad_norm": max_grad_norm, "no_prox": no_prox, "foreach": foreach}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of every group."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip = clip_factor(self, self.defaults["max_grad_norm"], self.param_groups[-1]["eps"])
        for group in self.param_groups:
            beta1, beta2, beta3 = group["betas"]
            step = group["step"] = group.get("step", 0) + 1
            bc1, bc2, bc3 = 1.0 - beta1 ** step, 1.0 - beta2 ** step, 1.0 - beta3 ** step
            params, grads = _with_grads(group, clip)
            if not params:
                continue
            states = _adan_states(self, params, grads, step, with_z=False)
            denom = _adan_moments(group, states, grads, math.sqrt(bc3))
            lr, wd = group["lr"], group["weight_decay"]
            if group["no_prox"]:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_addcdiv_(params, [s["exp_avg"] for s in states], denom, value=-(lr / bc1))
            torch._foreach_addcdiv_(params, [s["exp_avg_diff"] for s in states], denom, value=-(lr * beta2 / bc2))
            if not group["no_prox"]:
                torch._foreach_div_(params, 1 + lr * wd)
            _keep_neg_grads(states, grads)
        return loss


# ---------------------------------------------------------------------------------------------------- AdamW family
@OPTIMIZER_REGISTRY.register()
class NeosrAdamWScheduleFree(_WeightSwitch):
    """neosr's ``adamw_sf``: schedule-free AdamW (schedulefree's early form).

    ``lr``, ``eps``, ``warmup_steps``, ``r``, ``weight_lr_power`` as ``adan_sf``; ``betas``: the interpolation
    (beta1) and the squared-gradient decay; ``weight_decay``: added to the normalised gradient at ``y``;
    ``foreach``: accepted, always multi-tensor (the same ops); ``schedule_free``: neosr's flag, must be true.
    """

    other_names = ("adamw_sf",)

    def __init__(self, params: Params, lr: float = 8e-4, betas: tuple[float, float] = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: float = 0.0, r: float = 0.0,
                 weight_lr_power: float = 2.0, schedule_free: bool = True, foreach: bool = True) -> None:
        _number("lr", lr, 0.0)
        _number("eps", eps, 0.0)
        _number("weight_decay", weight_decay, 0.0)
        _number("warmup_steps", warmup_steps, 0.0)
        _number("r", r)
        _number("weight_lr_power", weight_lr_power)
        _flag("foreach", foreach)
        _schedule_free(schedule_free, wanted=True, name="adamw_sf",
                       instead="for plain AdamW use type AdamW")
        defaults = {"lr": lr, "betas": _betas(betas, 2, first_positive=True), "eps": eps, "r": r, "k": 0,
                    "warmup_steps": warmup_steps, "train_mode": True, "weight_sum": 0.0, "lr_max": -1.0,
                    "weight_lr_power": weight_lr_power, "weight_decay": weight_decay, "foreach": foreach}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of every group (in train mode only)."""
        loss = self._begin(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            k = group["k"]
            warmup = group["warmup_steps"]
            sched = (k + 1) / warmup if k < warmup else 1.0
            lr = group["lr"] * sched * math.sqrt(1 - beta2 ** (k + 1))
            ckp1 = self._averaging_weight(group, k + 1, lr)
            params, grads = _with_grads(group, None)
            for p in params:
                state = self.state[p]
                if "z" not in state:
                    state.update(z=p.detach().clone(), exp_avg_sq=torch.zeros_like(p))
            if params:
                z = [self.state[p]["z"] for p in params]
                v = [self.state[p]["exp_avg_sq"] for p in params]
                torch._foreach_mul_(v, beta2)
                torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
                denom = torch._foreach_sqrt(v)
                torch._foreach_add_(denom, group["eps"])
                update = torch._foreach_div(grads, denom)
                if group["weight_decay"] != 0:
                    torch._foreach_add_(update, params, alpha=group["weight_decay"])
                torch._foreach_lerp_(params, z, ckp1)
                torch._foreach_add_(params, update, alpha=lr * (beta1 * (1 - ckp1) - 1))
                torch._foreach_sub_(z, update, alpha=lr)
            group["k"] = k + 1
        return loss


_WIN_MODES = ("win", "win2", "none")


@OPTIMIZER_REGISTRY.register()
class AdamWWin(torch.optim.Optimizer):
    """neosr's ``adamw_win``: AdamW with Win / Win2 acceleration (Zhou et al., "Win: Weight-Decay-Integrated
    Nesterov Acceleration for Adaptive Gradient Algorithms", ICLR 2023).

    ``lr``: the conservative step; ``betas``: the gradient and squared-gradient decays; ``reckless_steps``: the
    reckless steps' multiples of ``lr`` (Win uses the first, Win2 both); ``eps``; ``weight_decay``: decoupled;
    ``amsgrad``: normalise by the largest squared-gradient average so far; ``max_grad_norm``: clip the global gradient
    norm to it (0: none); ``acceleration_mode``: ``win``, ``win2`` or ``none`` (plain AdamW); ``schedule_free`` must be
    false and ``warmup_steps`` 0.
    """

    other_names = ("adamw_win",)

    def __init__(self, params: Params, lr: float = 5e-4, betas: tuple[float, float] = (0.98, 0.999),
                 reckless_steps: tuple[float, float] = (2.0, 8.0), eps: float = 1e-8, weight_decay: float = 0.02,
                 amsgrad: bool = False, max_grad_norm: float = 0.0, acceleration_mode: str = "win2",
                 schedule_free: bool = False, warmup_steps: int = 0) -> None:
        _number("lr", lr, 0.0)
        _number("eps", eps, 0.0)
        _number("weight_decay", weight_decay, 0.0)
        _number("max_grad_norm", max_grad_norm, 0.0)
        _flag("amsgrad", amsgrad)
        if isinstance(reckless_steps, str) or not isinstance(reckless_steps, Sequence) or len(reckless_steps) != 2:
            raise OptimizerArgumentError("reckless_steps", f"must be two numbers, got {reckless_steps!r}")
        for i, s in enumerate(reckless_steps):
            _number(f"reckless_steps[{i}]", s, 0.0, open_low=True)  # Win2 divides by the first
        if acceleration_mode not in _WIN_MODES:
            raise OptimizerArgumentError("acceleration_mode", f"must be one of {', '.join(_WIN_MODES)}, got "
                                         f"{acceleration_mode!r}")
        _schedule_free(schedule_free, wanted=False, name="adamw_win",
                       instead="use type adamw_sf for schedule-free AdamW")
        _no_warmup(warmup_steps, "adamw_win")
        defaults = {"lr": lr, "betas": _betas(betas, 2), "reckless_steps": tuple(reckless_steps), "eps": eps,
                    "weight_decay": weight_decay, "amsgrad": amsgrad, "max_grad_norm": max_grad_norm,
                    "acceleration_mode": acceleration_mode}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of every group."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        max_norm = self.defaults["max_grad_norm"]
        clip = clip_factor(self, max_norm if max_norm > 1e-8 else 0.0, self.param_groups[-1]["eps"])
        for group in self.param_groups:
            params, grads = _with_grads(group, clip)
            by_step: dict[int, list[int]] = {}  # the step is per parameter (neosr's state): one batch per value
            for i, p in enumerate(params):
                state = self.state[p]
                if not state:
                    self._init_state(state, p, group)
                state["step"] += 1
                by_step.setdefault(state["step"], []).append(i)
            for step, idx in by_step.items():
                self._update(group, step, [params[i] for i in idx], [grads[i] for i in idx])
        return loss

    @staticmethod
    def _init_state(state: dict[str, Any], p: Tensor, group: dict[str, Any]) -> None:
        state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        if group["acceleration_mode"] in ("win", "win2"):
            state["x"] = p.detach().clone()
        if group["acceleration_mode"] == "win2":
            state["y"] = p.detach().clone()
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p)

    def _update(self, group: dict[str, Any], step: int, params: list[Tensor], grads: list[Tensor]) -> None:
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        lr, wd, mode = group["lr"], group["weight_decay"], group["acceleration_mode"]
        bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
        m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        if group["amsgrad"]:
            vmax = [s["max_exp_avg_sq"] for s in states]
            torch._foreach_maximum_(vmax, v)
            v = vmax
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(bc2))
        torch._foreach_add_(denom, group["eps"])
        if mode == "none":  # plain AdamW
            torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_addcdiv_(params, m, denom, value=-(lr / bc1))
            return
        update = torch._foreach_div(m, denom)
        torch._foreach_div_(update, bc1)
        x = [s["x"] for s in states]
        torch._foreach_add_(x, update, alpha=-lr)  # the conservative step, then its decay
        torch._foreach_mul_(x, 1.0 / (1 + lr * wd))
        reckless_y, reckless_z = group["reckless_steps"]
        lr_y = reckless_y * lr
        y_x = lr_y / lr if lr > 0 else reckless_y  # the ratio of the steps; its limit at lr 0 (a schedule's end)
        gamma = 1.0 / (1.0 + y_x + lr_y * wd)
        target = params if mode == "win" else [s["y"] for s in states]  # Win's reckless point is the parameter
        torch._foreach_mul_(target, gamma)
        torch._foreach_add_(target, x, alpha=y_x * gamma)
        torch._foreach_add_(target, update, alpha=-lr_y * gamma)
        if mode == "win2":  # a second, more reckless point from both
            lr_z = reckless_z * lr
            z_x, z_y = (lr_z / lr, lr_z / lr_y) if lr > 0 else (reckless_z, reckless_z / reckless_y)
            gamma = 1.0 / (1.0 + z_x + z_y + lr_z * wd)
            torch._foreach_mul_(params, gamma)
            torch._foreach_add_(params, update, alpha=-lr_z * gamma)
            torch._foreach_add_(params, x, alpha=z_x * gamma)
            torch._foreach_add_(params, target, alpha=z_y * gamma)


__all__ = ["AdamWWin", "NeosrAdanScheduleFree", "NeosrAdamWScheduleFree", "NeosrAdan"]
