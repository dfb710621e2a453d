"""What every model shares: networks, optimisers, schedules, EMA, and its resumable state."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.models.ema import EMA
from anysr.models.lr_scheduler import IterScheduler, build_scheduler
from anysr.models.optimizers import build_optimizer, has_weight_switch, param_groups


@dataclass(frozen=True)
class WeightNeed:
    """A weights file a model uses besides its own training state; the engine reads it (``load_model_weights``),
    the model only says where the options name it and what to do with it (models do no file I/O).

    ``apply(state_dict, load_into)`` hands the weights over; ``load_into(net, sd)`` checks and copies them into a
    network with the need's ``strict`` and names the file in errors. ``fresh_only``: used when training starts
    from scratch, not on resume (the training state has them). ``stand_in``: random weights of the right layout,
    for commands that only time the model (``anysr bench``). ``known``: the name of a standard file (torchvision's
    ``vgg19``, ``lpips_alex``, ...) the engine finds by name (torch hub's cache, else a verified download) when
    ``path`` is not set.
    """

    name: str
    option: str
    path: str | None
    apply: Callable[[Mapping[str, torch.Tensor], Callable[[nn.Module, Mapping[str, torch.Tensor]], None]], None]
    param_key: str = "params"
    key_option: str = "path.param_key_g"
    strict: bool = True
    required: bool = False
    fresh_only: bool = True
    missing: str = ""
    stand_in: Callable[[], Mapping[str, torch.Tensor]] | None = None
    known: str | None = None
    unset: str = ""  # a start-up log line when ``path`` is not set (what the network starts from instead)


class BaseModel(ABC):
    """Holds the networks and their training machinery; asks the accelerator for everything device-related.

    The engine calls, in this order: ``weight_needs`` (then hands the files' weights over), ``setup`` (networks
    on the device, losses, optimisers), ``load_state_dict`` on resume, then per iteration
    ``update_learning_rate`` and ``train_step``; ``inference_net`` for validation and testing; ``state_dict`` /
    ``weights`` to save.
    """

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        self.opt = opt
        self.acc = accelerator
        self.is_train = bool(opt["is_train"])
        self.nets: dict[str, nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, IterScheduler] = {}
        self.emas: dict[str, EMA] = {}

    # ---------------------------------------------------------------- the contract
    def weight_needs(self) -> list[WeightNeed]:
        """Weights files this model reads: the generator's pretrained weights (``path.pretrain_network_g``),
        required when not training a network that has parameters (``anysr test``)."""
        paths = self.opt["path"]
        net_g = self.nets["net_g"]
        return [WeightNeed(
            "net_g", "path.pretrain_network_g", paths["pretrain_network_g"],
            lambda sd, load: load(net_g, sd), param_key=paths["param_key_g"] or "params",
            strict=bool(paths["strict_load_g"]),
            required=not self.is_train and any(True for _ in net_g.parameters()),
            missing="a test needs trained weights; set it to a .safetensors or .pth file")]

    def discriminator_weight_need(self) -> WeightNeed:
        """The discriminator's pretrained weights (``path.pretrain_network_d``, fresh runs), for GAN models."""
        paths = self.opt["path"]
        net_d = self.nets["net_d"]
        return WeightNeed("net_d", "path.pretrain_network_d", paths["pretrain_network_d"],
                          lambda sd, load: load(net_d, sd), param_key=paths["param_key_d"] or "params",
                          key_option="path.param_key_d", strict=bool(paths["strict_load_d"]))

    def discriminator_backbone_needs(self) -> list[WeightNeed]:
        """A discriminator encoder's pretrained weights, for GAN models whose ``network_d`` has ``backbone_weights``
        (neosr's ea2fpn: a torchvision ``resnet18`` state dict; fresh runs). Read before ``path.pretrain_network_d``,
        which, when set, holds the whole discriminator and wins."""
        net_d = self.nets["net_d"]
        backbone = getattr(net_d, "backbone", None)
        if not callable(backbone) or not hasattr(net_d, "backbone_weights"):
            return []
        encoder = backbone()
        unset = "" if self.opt["path"]["pretrain_network_d"] else (
            f"net_d encoder: random weights (network_d.backbone_weights not set; neosr starts {type(net_d).__name__}'s "
            "from torchvision's ImageNet file)")
        return [WeightNeed("net_d encoder", "network_d.backbone_weights", net_d.backbone_weights,
                           lambda sd, load: load(encoder, sd), param_key="auto",
                           key_option="network_d.backbone_weights (a torchvision state dict)", unset=unset)]

    def input_shape(self, batch: int, channels: int, size: int) -> tuple[int, ...]:
        """The shape of a batch of ``size`` x ``size`` inputs (video models add the frames), for timing runs."""
        return (batch, channels, size, size)

    def bench_batch(self, lq: torch.Tensor, gt: torch.Tensor) -> tuple[dict[str, Any], int]:
        """A training micro-batch made of the synthetic ``lq`` / ``gt`` batch (``anysr bench``), and how many
        network inputs it holds per sample (MMRealSR's models restore five versions of each)."""
        return {"lq": lq, "gt": gt}, 1

    @abstractmethod
    def setup(self) -> None:
        """Place the networks on the device and build losses, EMA and optimisers (after ``weight_needs``)."""

    def prepare_train_set(self, dataset: Any) -> None:
        """Called with the training set once it is built; a model may hand it per-sample work for the loader
        workers (``RealESRGANModel`` with ``degrade_in: loader``). Default: nothing."""
        del dataset

    @abstractmethod
    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """One optimiser step over ``len(batches)`` accumulated micro-batches; the losses, on the device."""

    # ---------------------------------------------------------------- building
    def add_ema(self, name: str, decay: float, train: Mapping[str, Any]) -> None:
        """Track an EMA copy of ``nets[name]`` (call after ``prepare_model``); ``train``: the options of its
        schedule (``ema_power``, ``ema_update_after_step``, ``ema_switch_iter``, ``ema_warmup``)."""
        if decay > 0:
            self.emas[name] = EMA(self.acc.strategy.unwrap(self.nets[name]), decay, power=train.get("ema_power"),
                                  update_after=int(train.get("ema_update_after_step") or 0),
                                  switch_every=int(train.get("ema_switch_iter") or 0),
                                  warmup=bool(train["ema_warmup"]))

    def add_optimizer(self, name: str, net: nn.Module, opt: dict[str, Any], key_path: str) -> None:
        """The optimizer of ``net`` from ``opt`` (its ``param_groups`` split the parameters) and its schedule."""
        named = [(n, p) for n, p in self.acc.strategy.unwrap(net).named_parameters() if p.requires_grad]
        self.optimizers[name] = build_optimizer(param_groups(named, opt, key_path), opt, key_path)
        train = self.opt["train"]
        self.schedulers[name] = build_scheduler(self.optimizers[name], train["scheduler"],
                                                int(train["warmup_iter"]), lr_key=f"{key_path}.lr")

    # ---------------------------------------------------------------- optimizers with a weight switch
    @contextlib.contextmanager
    def optimizer_weights(self, sync: bool = True) -> Iterator[None]:
        """Within: the parameters are the weights the optimizers mean, not the ones they train (schedule-free's
        averaged ``x`` instead of the interpolated ``y``; no change for other optimizers). After: exactly the
        training weights again (restored from a copy, not switched back in floating point), so validating, saving
        or an EMA update never changes the course of training. Used around validation, ``weights()`` (saving,
        export) and the EMA update; ``state_dict()`` keeps the training weights (exact resume). ``sync``: end the
        traced graph before and after (XLA), so the switch is its own small graph; not within a training step."""
        self.acc.sync_model(self)
        switching = [o for o in self.optimizers.values() if has_weight_switch(o)]
        if not switching:
            yield
            return
        kept = [[(p, p.detach().clone()) for g in o.param_groups for p in g["params"]] for o in switching]
        with torch.no_grad():
            for o in switching:
                o.eval()  # type: ignore[attr-defined]
            if sync:
                self.acc.mark_step()
            try:
                yield
            finally:
                for o, pairs in zip(switching, kept):
                    o.train()  # type: ignore[attr-defined]
                    for p, saved in pairs:
                        p.copy_(saved)
                if sync:
                    self.acc.mark_step()

    def update_emas(self) -> None:
        """Update every EMA from its network (after the optimizer step), from the weights the optimizer means."""
        if not self.emas:
            return
        with self.optimizer_weights(sync=False):
            for name, ema in self.emas.items():
                ema.update(self.bare(name))

    # ---------------------------------------------------------------- schedule
    def update_learning_rate(self, current_iter: int) -> None:
        for sched in self.schedulers.values():
            sched.step_to(current_iter)

    def observe_validation(self, dataset: str, metrics: dict[str, float], better: dict[str, str]) -> list[str]:
        """A validation's results, for schedules that follow a metric (ReduceLROnPlateau); the lines to log."""
        said = []
        for sched in self.schedulers.values():
            observe = getattr(sched, "observe", None)
            line = observe(dataset, metrics, better) if observe is not None else None
            if line:
                said.append(line)
        return said

    def set_lr_scale(self, scale: float) -> None:
        """Every optimizer's learning rates are ``scale`` x their schedule's from now on (NaN recovery); the
        schedules keep the scale in their state, so it survives a save and resume."""
        for sched in self.schedulers.values():
            sched.set_lr_scale(scale)

    def current_lr(self) -> float:
        first = next(iter(self.optimizers.values()), None)
        return float(first.param_groups[0]["lr"]) if first is not None else 0.0

    # ---------------------------------------------------------------- state
    def bare(self, name: str) -> nn.Module:
        return self.acc.strategy.unwrap(self.nets[name])

    def weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """BasicSR-style weight groups of the generator: ``params`` and, with EMA, ``params_ema``."""
        with self.optimizer_weights():
            groups = {"params": self.bare("net_g").state_dict()}
            if any(has_weight_switch(o) for o in self.optimizers.values()):
                # copied out before the switch back (on the host: no new device graph after the warm-up)
                groups["params"] = {k: v.clone() for k, v in self.acc.to_host(groups["params"]).items()}
        if "net_g" in self.emas:
            groups["params_ema"] = self.emas["net_g"].module.state_dict()
        return groups

    def state_dict(self) -> dict[str, Any]:
        """Everything of the model that decides the future of training (with ``train.sam``, FSAM's momentum)."""
        self.acc.sync_model(self)
        state = {
            "nets": {k: self.bare(k).state_dict() for k in self.nets},
            "emas": {k: e.state_dict() for k, e in self.emas.items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
        }
        fsam = getattr(self, "fsam", None)
        if fsam is not None:
            state["sam"] = fsam.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, sd in state["nets"].items():
            self.bare(k).load_state_dict(sd)
        for k, sd in state["emas"].items():
            if k in self.emas:
                self.emas[k].load_state_dict(sd)
        for k, sd in state["optimizers"].items():
            self.optimizers[k].load_state_dict(sd)
        for k, sd in state["schedulers"].items():
            self.schedulers[k].load_state_dict(sd)
        fsam = getattr(self, "fsam", None)
        if fsam is not None and state.get("sam") is not None:  # older states (or runs without train.sam): none
            fsam.load_state_dict(state["sam"])

    def inference_net(self) -> nn.Module:
        """The generator to validate / test with: the EMA copy when there is one."""
        self.acc.sync_model(self)
        if "net_g" in self.emas:
            return self.emas["net_g"].module
        return self.bare("net_g")
