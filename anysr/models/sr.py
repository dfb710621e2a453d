"""SRModel: a generator trained with pixel losses (BasicSR's SRModel)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.errors import OptionError
from anysr.losses import build_loss
from anysr.models.base import BaseModel
from anysr.registry import MODEL_REGISTRY


@MODEL_REGISTRY.register()
class SRModel(BaseModel):
    """``network_g`` trained with ``train.pixel_opt`` (L1 / MSE / Charbonnier), with optional EMA."""

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.nets["net_g"] = build_network(self.generator_options())
        if self.is_train and self.opt["train"]["perceptual_opt"] and not type(self).uses_perceptual:
            raise OptionError(f"train.perceptual_opt: model_type {type(self).__name__} trains with pixel losses "
                              "only; use model_type: SRGANModel or ESRGANModel, or remove it")

    uses_perceptual = False  # whether train.perceptual_opt is used (GAN models); a pixel model refuses it

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
        self.add_ema("net_g", float(train["ema_decay"]))
        self.losses: dict[str, torch.nn.Module] = {}
        if train["pixel_opt"]:
            self.losses["l_pix"] = build_loss(train["pixel_opt"], "train.pixel_opt").to(self.acc.device)
        self.add_optimizer("net_g", net, train["optim_g"], "train.optim_g")
        self.grad_clip_norm = train["grad_clip_norm"]
        self.forward_g = self.acc.compile_model(net)

    def compute_losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        with self.acc.precision.autocast():
            output = self.forward_g(batch["lq"])
        output = output.float()
        return {name: loss(output, batch["gt"]) for name, loss in self.losses.items()}

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """One optimiser step over ``len(batches)`` accumulated micro-batches; losses stay on the device."""
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
