"""Learning-rate schedules as pure functions of the iteration, so resuming restores them exactly."""

from __future__ import annotations

import bisect
import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch

from anysr.errors import OptionError
from anysr.registry import SCHEDULER_REGISTRY, plain_options


class IterScheduler:
    """Sets every param group's lr to ``initial_lr * factor(iteration)`` (iterations count from 1).

    ``warmup_iter > 0`` scales the lr linearly over the first iterations (as BasicSR does).

    Resuming (``load_state_dict``) continues with the schedule the options give now. When they changed since the
    state was saved (milestones, periods, total_iter, the optimizer's lr, warmup_iter), the run continues only if
    the learning rate at the resumed iteration is the one the saved run used (a change that only moves what is
    still ahead, e.g. a later milestone or a longer stable phase); otherwise it is refused, naming the keys.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_iter: int = -1) -> None:
        self.optimizer = optimizer
        self.warmup_iter = warmup_iter
        self.base_lrs = [float(g.setdefault("initial_lr", g["lr"])) for g in optimizer.param_groups]
        self.last_iter = 0
        self.options: dict[str, Any] = {}  # the schedule's arguments, as the options gave them (build_scheduler)
        self.key_path = "train.scheduler"
        self.lr_key = "train.optim_g.lr"
        self.lr_scale = 1.0  # lowered by each NaN recovery (train.nan_recovery.lr_factor); saved, so it lasts

    def factor(self, it: int) -> float:
        """The schedule's multiplier at iteration ``it`` (1 = no change)."""
        del it
        return 1.0

    def warmup(self, it: int) -> float:
        """The linear warm-up factor at ``it`` (1 after ``warmup_iter``)."""
        return it / self.warmup_iter if 0 < self.warmup_iter and it < self.warmup_iter else 1.0

    def lr_at(self, it: int) -> list[float]:
        f = self.factor(it) * self.warmup(it)
        return [base * f for base in self.base_lrs]

    def step_to(self, it: int) -> None:
        """Set the lr for iteration ``it``."""
        self.last_iter = it
        for group, lr in zip(self.optimizer.param_groups, self.lr_at(it)):
            group["lr"] = lr * self.lr_scale

    def state_dict(self) -> dict[str, Any]:
        return {"last_iter": self.last_iter, "base_lrs": list(self.base_lrs),
                "lrs": [float(g["lr"]) for g in self.optimizer.param_groups],
                "options": {**self.options, "warmup_iter": self.warmup_iter}, "lr_scale": self.lr_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        it = int(state["last_iter"])
        self.lr_scale = float(state.get("lr_scale", 1.0))
        if "lrs" not in state:  # a state saved before the rule: its base lrs, as then
            self.base_lrs = [float(v) for v in state["base_lrs"]]
            self.step_to(it)
            return
        self.restore(state)
        self.check_continues(state, it)

    def set_lr_scale(self, scale: float) -> None:
        """The learning rates are ``scale`` x the schedule's from now on (NaN recovery), this iteration's included."""
        self.lr_scale = float(scale)
        self.step_to(self.last_iter)

    def restore(self, state: dict[str, Any]) -> None:
        """Set the schedule to the saved iteration (stateful schedules restore or replay their state here)."""
        self.step_to(int(state["last_iter"]))

    def check_continues(self, state: dict[str, Any], it: int) -> None:
        now = [float(g["lr"]) for g in self.optimizer.param_groups]
        then = [float(v) for v in state["lrs"]]
        if len(now) == len(then) and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(now, then)):
            return
        old = state.get("options", {})
        new = {**self.options, "warmup_iter": self.warmup_iter}
        changed = [f"{self._key(k)} ({old.get(k, 'unset')} there, {new.get(k, 'unset')} now)"
                   for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        saved_base = [float(v) for v in state["base_lrs"]]
        if saved_base != self.base_lrs:
            changed.append(f"{self.lr_key} ({saved_base} there, {self.base_lrs} now)")
        raise OptionError(
            f"cannot resume at iteration {it}: the learning-rate schedule changed ({'; '.join(changed) or 'its type'})"
            f" and would jump from {then} to {now} at this iteration. Restore those options (a change may only "
            "move what is still ahead, e.g. a later milestone), or start a new run with another `name` (with "
            "path.pretrain_network_g to start from the weights)")

    def _key(self, k: str) -> str:
        if k == "warmup_iter":
            return "train.warmup_iter"
        if k in TOTAL_ITER_ARGS:
            return f"{self.key_path}.{k} (train.total_iter unless set)"
        return f"{self.key_path}.{k}"


TOTAL_ITER_ARGS = ("total_iter", "total_steps", "T_max")
"""Schedule arguments the options fill from ``train.total_iter`` when they are not given."""


class ConstantLR(IterScheduler):
    """No decay (warm-up only)."""


@SCHEDULER_REGISTRY.register()
@SCHEDULER_REGISTRY.register(name="MultiStepRestartLR")
class MultiStepLR(IterScheduler):
    """Multiply by ``gamma`` at each milestone (torch MultiStepLR semantics on iterations); BasicSR's
    MultiStepRestartLR: at each of ``restarts`` the lr goes back to ``initial lr * restart_weights[i]`` and the
    milestones after it decay from there."""

    def __init__(self, optimizer: torch.optim.Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 restarts: Sequence[int] | None = None, restart_weights: Sequence[float] | None = None,
                 warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = float(gamma)
        self.restarts = [int(r) for r in restarts] if restarts is not None else [0]
        self.restart_weights = [float(w) for w in restart_weights] if restart_weights is not None else \
            [1.0] * len(self.restarts)
        if len(self.restarts) != len(self.restart_weights):
            raise OptionError("train.scheduler: restarts and restart_weights must have the same length "
                              f"({len(self.restarts)} vs {len(self.restart_weights)})")

    def factor(self, it: int) -> float:
        past = [(r, w) for r, w in zip(self.restarts, self.restart_weights) if r <= it]
        start, weight = max(past) if past else (-1, 1.0)
        decays = bisect.bisect_right(self.milestones, it) - bisect.bisect_right(self.milestones, start)
        return weight * self.gamma ** decays


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


@SCHEDULER_REGISTRY.register()
class CosineWarmupLR(IterScheduler):
    """Linear warm-up over ``train.warmup_iter``, then one cosine from the lr down to ``eta_min`` at
    ``total_iter`` (default: ``train.total_iter``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_iter: int, eta_min: float = 0.0,
                 warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        self.total_iter = int(total_iter)
        self.eta_min = float(eta_min)

    def lr_at(self, it: int) -> list[float]:
        start = max(self.warmup_iter, 0)
        if it < start:
            return [base * self.warmup(it) for base in self.base_lrs]
        t = min(1.0, (it - start) / max(self.total_iter - start, 1))
        cos = 0.5 * (1 + math.cos(math.pi * t))
        return [self.eta_min + (base - self.eta_min) * cos for base in self.base_lrs]


_DECAYS = {
    "linear": lambda t: 1.0 - t,
    "cosine": lambda t: 0.5 * (1 + math.cos(math.pi * t)),
    "sqrt": lambda t: 1.0 - math.sqrt(t),
}


@SCHEDULER_REGISTRY.register()
class WarmupStableDecayLR(IterScheduler):
    """Warm-up (``train.warmup_iter``), a stable lr, then a decay to ``eta_min`` over the last ``decay_iter``
    iterations (default: ``decay_ratio`` of ``total_iter``); ``decay``: linear, cosine or sqrt. Extending
    ``train.total_iter`` on resume during the stable phase continues consistently (the decay moves later)."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_iter: int, decay_iter: int | None = None,
                 decay_ratio: float = 0.2, decay: str = "linear", eta_min: float = 0.0,
                 warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        if decay not in _DECAYS:
            raise OptionError(f"train.scheduler.decay: '{decay}' is not one of {', '.join(_DECAYS)}")
        self.total_iter = int(total_iter)
        self.decay_iter = int(decay_iter) if decay_iter is not None else round(float(decay_ratio) * self.total_iter)
        self.decay = _DECAYS[decay]
        self.eta_min = float(eta_min)

    def lr_at(self, it: int) -> list[float]:
        start = self.total_iter - self.decay_iter
        if it <= start or self.decay_iter <= 0:
            return [base * self.warmup(it) for base in self.base_lrs]
        f = self.decay(min(1.0, (it - start) / self.decay_iter))
        return [self.eta_min + (base - self.eta_min) * f for base in self.base_lrs]


class _Shadow(torch.optim.Optimizer):
    """A stand-in optimizer with the real one's hyperparameters per group, that a torch schedule drives; its
    values go to the real optimizer (with the warm-up applied), so the schedule sees none of ours."""

    def __init__(self, real: torch.optim.Optimizer, base_lrs: list[float]) -> None:
        groups = [{**{k: v for k, v in g.items() if k not in ("params", "initial_lr")}, "lr": lr,
                   "params": [torch.zeros(0)]} for g, lr in zip(real.param_groups, base_lrs)]
        super().__init__(groups, dict(real.defaults))

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing to update: it only carries the schedule's values."""
        del closure


_NESTING = ("SequentialLR", "ChainedScheduler")  # their ``schedulers``: a list of {type: ..., arguments}
_FOLLOWED = ("momentum", "betas")  # hyperparameters a torch schedule may cycle besides lr (OneCycleLR, CyclicLR)


class TorchScheduler(IterScheduler):
    """A ``torch.optim.lr_scheduler`` class stepped once per iteration (after ``it`` steps at iteration ``it``, as
    BasicSR steps its schedules), on a shadow of the optimizer; its state is saved, and replayed on resume when its
    arguments changed."""

    torch_cls: type

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_iter: int = -1, **kwargs: Any) -> None:
        super().__init__(optimizer, warmup_iter)
        self.kwargs = kwargs
        self._build()

    def _build(self) -> None:
        self.shadow = _Shadow(self.optimizer, self.base_lrs)
        kwargs = dict(self.kwargs)
        if self.torch_cls.__name__ in _NESTING and isinstance(kwargs.get("schedulers"), list):
            kwargs["schedulers"] = [self._nested(i, spec) for i, spec in enumerate(kwargs["schedulers"])]
        try:
            self.sched = self.torch_cls(optimizer=self.shadow, **kwargs) if self.torch_cls.__name__ == \
                "ChainedScheduler" else self.torch_cls(self.shadow, **kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            raise OptionError(f"{self.key_path}: {self.torch_cls.__name__}: {exc}") from None
        self.sched_iter = 0

    def _nested(self, i: int, spec: Any) -> Any:
        """One of SequentialLR's / ChainedScheduler's ``schedulers``: ``{type: <a torch schedule>, ...}``."""
        where = f"{self.key_path}.schedulers[{i}]"
        if not isinstance(spec, dict) or "type" not in spec:
            raise OptionError(f"{where}: expected {{type: <a torch schedule such as LinearLR>, <its arguments>}}")
        args = dict(spec)
        cls = SCHEDULER_REGISTRY.get(args.pop("type"), f"{where}.type")
        if not issubclass(cls, TorchScheduler) or getattr(cls, "unsupported", None):
            raise OptionError(f"{where}.type: {cls.__name__} cannot be nested; use torch's schedules (LinearLR, "
                              "CosineAnnealingLR, ConstantLR, ExponentialLR, ...)")
        try:
            return cls.torch_cls(self.shadow, **args)
        except (TypeError, ValueError, KeyError) as exc:
            raise OptionError(f"{where}: {cls.__name__}: {exc}") from None

    def lr_at(self, it: int) -> list[float]:
        """The lrs at ``it`` (the torch schedule is stepped there; back in time means replaying it)."""
        if it < self.sched_iter:
            self._build()
        while self.sched_iter < it:
            self.shadow.step()
            self.sched.step()
            self.sched_iter += 1
        w = self.warmup(it)
        return [float(g["lr"]) * w for g in self.shadow.param_groups]

    def step_to(self, it: int) -> None:
        super().step_to(it)
        for real, shadow in zip(self.optimizer.param_groups, self.shadow.param_groups):
            for k in _FOLLOWED:
                if k in real and k in shadow:
                    real[k] = shadow[k]

    def state_dict(self) -> dict[str, Any]:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.shadow.param_groups]
        return {**super().state_dict(), "torch": self.sched.state_dict(), "shadow_groups": groups}

    def restore(self, state: dict[str, Any]) -> None:
        old = state.get("options", {})
        if {k: v for k, v in old.items() if k != "warmup_iter"} == self.options \
                and [float(v) for v in state["base_lrs"]] == self.base_lrs:
            for g, saved in zip(self.shadow.param_groups, state["shadow_groups"]):
                g.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
            self.sched.load_state_dict(state["torch"])
            self.sched_iter = int(state["last_iter"])
        super().restore(state)  # replays the schedule from the start when its arguments changed


@SCHEDULER_REGISTRY.register()
class ReduceLROnPlateau(IterScheduler):
    """torch's ReduceLROnPlateau on a validation metric: after ``patience`` validations without an improvement
    (by ``threshold``, ``rel`` or ``abs``), multiply the lr by ``factor`` (not below ``min_lr``), then wait
    ``cooldown`` validations. ``metric`` names a ``val.metrics`` entry (default: the first) and ``dataset`` a
    validation set (default: the first); ``mode`` ``auto`` follows the metric's direction (PSNR: max, LPIPS: min).

    The reductions are this schedule's state (saved, so a resumed run continues them); between validations the lr
    is constant (warm-up aside). Checked every ``val.val_freq`` iterations, so ``patience`` counts validations.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "auto", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8, metric: str | None = None,
                 dataset: str | None = None, warmup_iter: int = -1) -> None:
        super().__init__(optimizer, warmup_iter)
        if mode not in ("auto", "min", "max"):
            raise OptionError(f"train.scheduler.mode: {mode!r}; use auto, min or max")
        if threshold_mode not in ("rel", "abs"):
            raise OptionError(f"train.scheduler.threshold_mode: {threshold_mode!r}; use rel or abs")
        if not 0 < factor < 1:
            raise OptionError(f"train.scheduler.factor: {factor}; give a factor between 0 and 1, e.g. 0.5")
        groups = len(optimizer.param_groups)
        mins = [float(m) for m in min_lr] if isinstance(min_lr, Sequence) else [float(min_lr)] * groups
        if len(mins) != groups:
            raise OptionError(f"train.scheduler.min_lr: {len(mins)} values for {groups} parameter groups")
        self.mode, self.plateau_factor, self.patience = mode, float(factor), int(patience)
        self.threshold, self.threshold_mode, self.cooldown = float(threshold), threshold_mode, int(cooldown)
        self.min_lrs, self.eps, self.metric, self.dataset = mins, float(eps), metric, dataset
        self.scales = [1.0] * groups
        self.best: float | None = None
        self.num_bad = 0
        self.cooldown_left = 0
        self.seen = 0  # validations observed

    def lr_at(self, it: int) -> list[float]:
        w = self.warmup(it)
        return [base * scale * w for base, scale in zip(self.base_lrs, self.scales)]

    def _better(self, value: float, higher: bool) -> bool:
        if self.best is None:
            return True
        if self.threshold_mode == "rel":
            return value > self.best * (1 + self.threshold) if higher else value < self.best * (1 - self.threshold)
        return value > self.best + self.threshold if higher else value < self.best - self.threshold

    def observe(self, dataset: str, metrics: dict[str, float], better: dict[str, str]) -> str | None:
        """One validation's results; returns a line to log when the lr was lowered (``None`` otherwise)."""
        if not metrics or (self.dataset is not None and dataset != self.dataset):
            return None
        if self.dataset is None:
            self.dataset = dataset  # the first validation set decides
        name = self.metric or next(iter(metrics))
        if name not in metrics:
            return None
        higher = better.get(name, "higher") == "higher" if self.mode == "auto" else self.mode == "max"
        value = float(metrics[name])
        self.seen += 1
        if self._better(value, higher):
            self.best, self.num_bad = value, 0
        else:
            self.num_bad += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.num_bad = 0
        if self.num_bad <= self.patience:
            return None
        old = [base * scale for base, scale in zip(self.base_lrs, self.scales)]
        for i, (lr, low) in enumerate(zip(old, self.min_lrs)):
            new = max(lr * self.plateau_factor, low)
            if lr - new > self.eps and self.base_lrs[i] > 0:
                self.scales[i] = new / self.base_lrs[i]
        self.cooldown_left, self.num_bad = self.cooldown, 0
        self.step_to(self.last_iter)
        return (f"ReduceLROnPlateau: {dataset} {name} has not improved on {self.best:.4g} for {self.patience + 1} "
                f"validations; lr x{self.plateau_factor:g} -> {float(self.optimizer.param_groups[0]['lr']):.3e}")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "plateau": {
            "scales": list(self.scales), "best": self.best, "num_bad": self.num_bad,
            "cooldown_left": self.cooldown_left, "seen": self.seen, "dataset": self.dataset}}

    def restore(self, state: dict[str, Any]) -> None:
        saved = state.get("plateau")
        if isinstance(saved, dict) and len(saved.get("scales", [])) == len(self.scales):
            self.scales = [float(v) for v in saved["scales"]]
            self.best = None if saved.get("best") is None else float(saved["best"])
            self.num_bad, self.cooldown_left = int(saved["num_bad"]), int(saved["cooldown_left"])
            self.seen = int(saved["seen"])
            self.dataset = saved.get("dataset") if self.dataset is None else self.dataset
        super().restore(state)


def _torch_schedulers() -> dict[str, type]:
    lrs = torch.optim.lr_scheduler
    return {n: c for n, c in vars(lrs).items() if inspect.isclass(c) and issubclass(c, lrs.LRScheduler)
            and c is not lrs.LRScheduler and not n.startswith("_")}


_UNSUPPORTED = {
    "LambdaLR": "its lr_lambda is a Python function, which option files do not hold; use a named schedule",
    "MultiplicativeLR": "its lr_lambda is a Python function, which option files do not hold; use ExponentialLR",
}


def _adapter(name: str, cls: type) -> type:
    drop = ("optimizer", "last_epoch", "verbose")
    params = [p for n, p in inspect.signature(cls).parameters.items() if n not in drop]
    sig = inspect.Signature([inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params,
                             inspect.Parameter("warmup_iter", inspect.Parameter.KEYWORD_ONLY, default=-1)])
    doc = f"torch.optim.lr_scheduler.{name}, stepped once per iteration."
    attrs: dict[str, Any] = {"torch_cls": cls, "__signature__": sig, "__doc__": doc}
    if name in _UNSUPPORTED:
        attrs["unsupported"] = _UNSUPPORTED[name]
    return type(name, (TorchScheduler,), attrs)


for _name, _cls in sorted(_torch_schedulers().items()):
    if _name not in SCHEDULER_REGISTRY:  # ours keep their names: MultiStepLR (the same values, BasicSR's restarts)
        SCHEDULER_REGISTRY.register(_adapter(_name, _cls), name=_name)


def build_scheduler(optimizer: torch.optim.Optimizer, opt: Any | None, warmup_iter: int = -1,
                    lr_key: str = "train.optim_g.lr") -> IterScheduler:
    """The schedule named by ``train.scheduler.type`` (SCHEDULER_REGISTRY; none: constant lr). ``lr_key``: the
    option of the optimizer's lr, named when a resume would change it."""
    if not opt:
        sched: IterScheduler = ConstantLR(optimizer, warmup_iter)
    else:
        kwargs = plain_options(opt)
        cls = SCHEDULER_REGISTRY.get(kwargs.pop("type"), "train.scheduler.type")
        if getattr(cls, "unsupported", None):
            raise OptionError(f"train.scheduler.type: {cls.__name__} is not supported: {cls.unsupported}")
        sched = cls(optimizer, warmup_iter=warmup_iter, **kwargs)
        sched.options = kwargs
    sched.lr_key = lr_key
    return sched
