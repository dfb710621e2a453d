"""SRModel: a generator trained with pixel losses (BasicSR's SRModel)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.arch_util import unit_range
from anysr.data.batch_augment import MIXING, BatchAugment
from anysr.errors import OptionError
from anysr.models.base import BaseModel, WeightNeed
from anysr.models.loss_set import (
    DISCRIMINATOR_ROLES,
    LossSpec,
    StateDicts,
    build_losses,
    loss_specs,
    loss_weight_needs,
)
from anysr.registry import MODEL_REGISTRY


@MODEL_REGISTRY.register()
class SRModel(BaseModel):
    """``network_g`` trained with ``train.pixel_opt`` (L1 / MSE / Charbonnier), with optional EMA."""

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.nets["net_g"] = unit_range(build_network(self.generator_options()))
        if self.is_train and self.opt["train"]["perceptual_opt"] and not type(self).uses_perceptual:
            raise OptionError(f"train.perceptual_opt: model_type {type(self).__name__} trains with pixel losses "
                              "only; use model_type: SRGANModel or ESRGANModel, or remove it")
        self.loss_specs: list[LossSpec] = loss_specs(self.opt["train"], type(self).__name__, type(self).loss_roles) \
            if self.is_train else []
        self.loss_state_dicts: dict[str, StateDicts] = {}  # weight files of the losses, handed over by the engine
        self.current_iter = 0
        self.batch_augment = self._batch_augment() if self.is_train and self.opt["train"]["use_moa"] else None
        self.trained_pair: tuple[torch.Tensor, torch.Tensor] | None = None  # the last micro-batch trained on

    uses_perceptual = False  # whether train.perceptual_opt is used (GAN models); a pixel model refuses it
    image_batches = True  # whether batches are (B, C, H, W) images (train.use_moa); video models: clips
    loss_roles: tuple[str, ...] = ("pixel", "learned", "artifact")  # loss roles it trains with (options read it)
    loss_prefix = "l_"  # losses are logged as <prefix><name>: l_pix (BasicSR's SRModel)

    def weight_needs(self) -> list[WeightNeed]:
        return super().weight_needs() + loss_weight_needs(self.loss_specs, self.loss_state_dicts)

    def _batch_augment(self) -> BatchAugment:
        """``train.use_moa``: the batch augmentations, checked against the model and the batch size."""
        if not type(self).image_batches:
            raise OptionError(f"train.use_moa: {type(self).__name__} trains on clips; the batch augmentations are "
                              "for image models: set train.use_moa: false")
        aug = BatchAugment.from_options(self.opt["train"], int(self.opt["manual_seed"]),
                                        one_graph=self.acc.static_shapes)
        key = next((k for k in self.opt["datasets"] if k.startswith("train")), None)
        if aug.mixes and key is not None and int(self.opt["datasets"][key]["batch_size_per_gpu"]) < 2:
            mixing = ", ".join(k for k in aug.kinds if k in MIXING)
            raise OptionError(f"train.moa_augs: {mixing} mix two samples of a batch, but datasets.{key}."
                              "batch_size_per_gpu is 1; raise it to 2 or more, or give those augmentations weight 0 "
                              "in train.moa_probs")
        return aug

    def augment_batches(self, batches: Sequence[dict[str, Any]],
                        gt_keys: Sequence[str] = ("gt",)) -> Sequence[dict[str, Any]]:
        """The micro-batches with the drawn batch augmentation applied (``train.use_moa``), else as they are.

        The last one's ``lq`` / ``gt`` stay in ``trained_pair`` (references, no copy) for the trainer to show a few
        of the pairs the model trains on at each validation."""
        if self.batch_augment is not None:
            batches = [self.batch_augment(b, self.current_iter, k, self.acc.rank * int(b["lq"].shape[0]), gt_keys)
                       for k, b in enumerate(batches)]
        if batches and "lq" in batches[-1] and "gt" in batches[-1]:
            self.trained_pair = (batches[-1]["lq"], batches[-1]["gt"])
        return batches

    def update_learning_rate(self, current_iter: int) -> None:
        self.current_iter = current_iter
        super().update_learning_rate(current_iter)

    def generator_options(self) -> Any:
        """The generator's ``{type, arguments}`` (video models take out the weight paths the engine reads)."""
        return self.opt["network_g"]

    def setup(self) -> None:
        """Place networks on the device, then build EMA, losses and optimisers (in that order)."""
        net = self.acc.prepare_model(self.nets["net_g"])
        self.nets["net_g"] = net
        if not self.is_train:
            net.eval()
            return
        train = self.opt["train"]
        net.train()
        self.add_ema("net_g", float(train["ema_decay"]), train)
        specs = [s for s in self.loss_specs if s.role not in DISCRIMINATOR_ROLES]
        if any(s.role == "artifact" for s in specs) and "net_g" not in self.emas:
            raise OptionError(f"{next(s.key_path for s in specs if s.role == 'artifact')}: LDL compares with the EMA "
                              "generator's output; set train.ema_decay (e.g. 0.999)")
        self.losses: dict[str, torch.nn.Module] = build_losses(specs, self.loss_state_dicts, self.acc.device)
        self.add_optimizer("net_g", net, train["optim_g"], "train.optim_g")
        self.grad_clip_norm = train["grad_clip_norm"]
        self.forward_g = self.acc.compile_model(net)

    def ema_output(self, lq: torch.Tensor) -> torch.Tensor:
        """The EMA generator's output (no gradient), what LDL compares with."""
        with torch.no_grad(), self.acc.precision.autocast():
            return self.emas["net_g"].module(lq).float()

    def loss_terms(self, output: torch.Tensor, lq: torch.Tensor,
                   target: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every built loss but those on the discriminator's outputs, as ``{<loss_prefix><name>: value}`` in the
        options' order; ``target(role)`` is the GT a loss of that role compares with."""
        out: dict[str, torch.Tensor] = {}
        ema_out = None
        p = self.loss_prefix
        for spec in self.loss_specs:
            if spec.role in DISCRIMINATOR_ROLES:
                continue
            loss = self.losses[spec.name]
            if spec.role == "perceptual":
                percep, style = loss(output, target(spec.role))
                if percep is not None:
                    out[p + spec.name] = percep
                if style is not None:
                    out[p + spec.style_name] = style
            elif spec.role == "artifact":
                ema_out = self.ema_output(lq) if ema_out is None else ema_out
                out[p + spec.name] = loss(output, ema_out, target(spec.role))
            else:
                out[p + spec.name] = loss(output, target(spec.role))
        return out

    def loss_names(self) -> list[str]:
        """The keys ``loss_terms`` returns (the same every step)."""
        names = []
        for spec in self.loss_specs:
            if spec.role == "perceptual":
                loss = self.losses[spec.name]
                names += [self.loss_prefix + spec.name] if loss.perceptual_weight > 0 else []
                names += [self.loss_prefix + spec.style_name] if loss.style_weight > 0 else []
            elif spec.role not in DISCRIMINATOR_ROLES:
                names.append(self.loss_prefix + spec.name)
        return names

    def compute_losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        with self.acc.precision.autocast():
            output = self.forward_g(batch["lq"])
        output = output.float()
        return self.loss_terms(output, batch["lq"], lambda role: batch["gt"])

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """One optimiser step over ``len(batches)`` accumulated micro-batches; losses stay on the device."""
        batches = self.augment_batches(batches)
        net = self.nets["net_g"]
        opt = self.optimizers["net_g"]
        opt.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        n = len(batches)
        for k, batch in enumerate(batches):
            ctx = self.acc.strategy.no_sync(net) if k < n - 1 else contextlib.nullcontext()
            with ctx:
                losses = self.compute_losses(batch)
                total = sum(losses.values())
                self.acc.precision.backward(total / n)  # type: ignore[arg-type]
            for name, value in losses.items():
                part = value.detach() / n
                totals[name] = totals[name] + part if name in totals else part
        self.acc.optimizer_step(opt, self.grad_clip_norm)
        self.update_emas()
        return totals


@MODEL_REGISTRY.register()
class SwinIRModel(SRModel):
    """BasicSR's name for SwinIR training; here the arch pads to its window itself, so it is SRModel."""


@MODEL_REGISTRY.register()
class HATModel(SRModel):
    """The HAT authors' model type (XPixelGroup/HAT): SRModel whose test pads inputs to a multiple of the window
    and tiles them by the top-level ``tile`` option. Here HAT pads itself and ``tile`` sets ``val.tile``."""


@MODEL_REGISTRY.register()
class DATModel(SRModel):
    """The DAT authors' model type (zhengchen1999/DAT): SRModel with an optional split test (``val.use_chop``,
    accepted); ``val.tile`` tiles instead."""


@MODEL_REGISTRY.register()
class DRCTModel(SRModel):
    """The DRCT authors' model type (ming053l/DRCT): HATModel's padding and tiling, as SRModel here."""
