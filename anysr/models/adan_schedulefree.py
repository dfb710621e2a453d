"""AdanScheduleFree: Adan (Xie et al. 2022, arXiv:2208.06677) made schedule-free (Defazio et al. 2024,
arXiv:2405.15682), as traiNNer-redux trains with it: the same constructor arguments, defaults, state-dict keys and
``train()`` / ``eval()`` weight switch, so its option files and checkpoints carry over.

The parameters hold the interpolated point ``y`` during training; ``eval()`` moves them to the averaged ``x`` (what
is validated and saved) and ``train()`` back. The step is multi-tensor (``torch._foreach_*``) and has no host read:
the per-step factors (bias corrections, the averaging weight ``ckp1``) are Python floats computed from the step count
and the learning rates, and gradient clipping (``max_grad_norm > 0``) stays a device tensor, so an XLA step traces
the same graph every iteration (after the first, where ``ckp1`` is 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from anysr.errors import OptionError
from anysr.registry import OPTIMIZER_REGISTRY


class OptimizerArgumentError(OptionError, ValueError):
    """A constructor argument of an optimizer has a value it cannot work with; ``arg`` names it, so
    ``build_optimizer`` reports ``<key_path>.<arg>``."""

    def __init__(self, arg: str, message: str) -> None:
        super().__init__(f"{arg}: {message}")
        self.arg = arg
        self.detail = message


def _number(arg: str, value: Any, low: float | None = None, high: float | None = None, *,
            open_low: bool = False, open_high: bool = False) -> float:
    """``value`` as a float within [low, high] (``open_*``: that end excluded), or the error naming ``arg``."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise OptimizerArgumentError(arg, f"must be a finite number, got {value!r}")
    v = float(value)
    if low is not None and (v <= low if open_low else v < low):
        raise OptimizerArgumentError(arg, f"must be {'>' if open_low else '>='} {low:g}, got {value!r}")
    if high is not None and (v >= high if open_high else v > high):
        raise OptimizerArgumentError(arg, f"must be {'<' if open_high else '<='} {high:g}, got {value!r}")
    return v


def clip_factor(optimizer: torch.optim.Optimizer, max_grad_norm: float, eps: float) -> Tensor | None:
    """``min(1, max_grad_norm / (|g| + eps))`` over every gradient of every group (summed in parameter order), a
    device tensor (no host read); ``None`` without clipping (``max_grad_norm <= 0``) or without gradients."""
    if max_grad_norm <= 0:
        return None
    total = None
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                s = p.grad.pow(2).sum()
                total = s if total is None else total + s
    if total is None:
        return None
    return torch.clamp(max_grad_norm / (torch.sqrt(total) + eps), max=1.0)


class ScheduleFreeSwitch(torch.optim.Optimizer):
    """The schedule-free weight switch the model base calls: parameters hold ``y`` in train mode, the average ``x``
    in eval mode (validate, save), with ``y = (1 - beta1) z + beta1 x``; steps only in train mode."""

    def _switch(self, to_train: bool) -> None:
        for group in self.param_groups:
            if group["train_mode"] == to_train:
                continue
            beta1 = group["betas"][0]
            pairs = [(p, self.state[p]["z"]) for p in group["params"] if "z" in self.state[p]]
            if pairs:
                # y = (1 - beta1) z + beta1 x  <=>  x = y + (1 - 1/beta1) (z - y)
                torch._foreach_lerp_([p for p, _ in pairs], [z for _, z in pairs],
                                     1 - beta1 if to_train else 1 - 1 / beta1)
            group["train_mode"] = to_train

    @torch.no_grad()
    def eval(self) -> None:
        """Parameters to the averaged weights ``x`` (validate, save)."""
        self._switch(False)

    @torch.no_grad()
    def train(self) -> None:
        """Parameters back to the training point ``y``."""
        self._switch(True)

    def _check_train_mode(self) -> None:
        if not all(g["train_mode"] for g in self.param_groups):
            raise RuntimeError(f"{type(self).__name__}.step() in eval mode: call optimizer.train() before training "
                               "steps")

    def _begin(self, closure: Callable[[], float] | None) -> float | None:
        """A step's start: refused in eval mode; the closure, if any, run with gradients (its loss returned)."""
        self._check_train_mode()
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()


@OPTIMIZER_REGISTRY.register()
class AdanScheduleFree(ScheduleFreeSwitch):
    """Schedule-free Adan (traiNNer-redux's ``AdanScheduleFree``).

    ``lr``: step size (the warm-up scales only the averaging weights, not the step); ``betas``: the decays of the
    gradient average, of the gradient-difference average and of the squared-update average; ``eps``: added to the
    denominator; ``weight_decay``: decoupled, ``lr * weight_decay`` per step; ``max_grad_norm``: clip the global
    gradient norm to it (0: no clipping); ``warmup_steps``: the averaging weight's learning rate rises linearly over
    them; ``r``: polynomial weighting ``step ** r`` of the average; ``weight_lr_power``: the average weights each step
    by ``max_lr_so_far ** weight_lr_power``.

    Call ``train()`` before training steps and ``eval()`` before validating or saving (anysr's model base does).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float, float] = (0.98, 0.92, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.0, max_grad_norm: float = 0.0, warmup_steps: int = 10000, r: float = 0.0,
                 weight_lr_power: float = 2.0) -> None:
        _number("lr", lr, 0.0)
        _number("eps", eps, 0.0)
        _number("weight_decay", weight_decay, 0.0)
        _number("max_grad_norm", max_grad_norm, 0.0)
        _number("r", r)
        _number("weight_lr_power", weight_lr_power)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise OptimizerArgumentError("warmup_steps", f"must be an integer >= 0, got {warmup_steps!r}")
        if isinstance(betas, str) or not isinstance(betas, Sequence) or len(betas) != 3:
            raise OptimizerArgumentError("betas", f"must be three numbers (beta1, beta2, beta3), got {betas!r}")
        _number("betas[0]", betas[0], 0.0, 1.0, open_low=True, open_high=True)  # eval() divides by beta1
        _number("betas[1]", betas[1], 0.0, 1.0, open_high=True)
        _number("betas[2]", betas[2], 0.0, 1.0, open_high=True)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "max_grad_norm": max_grad_norm, "warmup_steps": warmup_steps, "r": r,
                    "weight_lr_power": weight_lr_power, "weight_sum": 0.0, "lr_max": -1.0, "train_mode": True}
        super().__init__(params, defaults)

    # ---------------------------------------------------------------- the weight switch
    @torch.no_grad()
    def restart_opt(self) -> None:
        """Start over from the current parameters: moments zero, ``z`` the parameters, step and average reset."""
        for group in self.param_groups:
            group.update(step=0, weight_sum=0.0, lr_max=-1.0)
            for p in group["params"]:
                if p.requires_grad:
                    state = self.state[p]
                    state.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                                 exp_avg_diff=torch.zeros_like(p), z=p.clone(memory_format=torch.preserve_format))

    # ---------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of every group (in train mode only)."""
        loss = self._begin(closure)
        clip = clip_factor(self, self.defaults["max_grad_norm"], self.param_groups[-1]["eps"])
        for group in self.param_groups:
            self._group_step(group, clip)
        return loss

    def _group_step(self, group: dict[str, Any], clip: Tensor | None) -> None:
        beta1, beta2, beta3 = group["betas"]
        step = group["step"] = group.get("step", 0) + 1
        lr = group["lr"]
        warmup = group["warmup_steps"]
        # the averaging weight: the largest (warmed-up) lr so far, to a power, times a polynomial of the step
        group["lr_max"] = lr_max = max(lr * (step / warmup if 0 < warmup and step < warmup else 1.0),
                                       group["lr_max"])
        weight = step ** group["r"] * lr_max ** group["weight_lr_power"]
        group["weight_sum"] += weight
        ckp1 = weight / group["weight_sum"] if group["weight_sum"] != 0 else 0.0

        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if clip is not None:
            grads = torch._foreach_mul(grads, clip)  # p.grad itself is left as it is
        states = [self.state[p] for p in params]
        for p, s in zip(params, states):
            if not s:
                s.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                         exp_avg_diff=torch.zeros_like(p), z=p.clone(memory_format=torch.preserve_format))
        fresh = [i for i, s in enumerate(states) if step == 1 or "neg_pre_grad" not in s]
        if fresh:  # the previous gradient of a first step is this one: no difference
            for i, neg in zip(fresh, torch._foreach_neg([grads[i] for i in fresh])):
                states[i]["neg_pre_grad"] = neg
        m, n, d, z, diff = ([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "exp_avg_diff", "z",
                                                              "neg_pre_grad"))

        torch._foreach_add_(diff, grads)  # g_t - g_{t-1}
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(d, beta2)
        torch._foreach_add_(d, diff, alpha=1 - beta2)
        torch._foreach_mul_(diff, beta2)
        torch._foreach_add_(diff, grads)  # g_t + beta2 (g_t - g_{t-1})
        torch._foreach_mul_(n, beta3)
        torch._foreach_addcmul_(n, diff, diff, value=1 - beta3)
        denom = torch._foreach_sqrt(n)
        torch._foreach_div_(denom, math.sqrt(1.0 - beta3 ** step))
        torch._foreach_add_(denom, group["eps"])

        m_size = lr / (1.0 - beta1 ** step)
        d_size = lr * beta2 / (1.0 - beta2 ** step)
        # y: towards z by ckp1, decayed, then the (1 - ckp1) share of the Adan update; z: the whole update
        torch._foreach_lerp_(params, z, ckp1)
        if group["weight_decay"] != 0:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_addcdiv_(params, m, denom, value=-m_size * (1 - ckp1))
        torch._foreach_addcdiv_(params, d, denom, value=-d_size * (1 - ckp1))
        torch._foreach_addcdiv_(z, m, denom, value=-m_size)
        torch._foreach_addcdiv_(z, d, denom, value=-d_size)
        for s, neg in zip(states, torch._foreach_neg(grads)):  # -g_t, the next step's previous gradient
            s["neg_pre_grad"] = neg


__all__ = ["AdanScheduleFree", "OptimizerArgumentError"]
