"""SRGANModel and ESRGANModel: a generator trained against a discriminator (BasicSR's GAN models)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.errors import OptionError
from anysr.losses import relativistic_discriminator_loss, relativistic_generator_loss
from anysr.models.base import WeightNeed
from anysr.models.loss_set import build_losses
from anysr.models.sr import SRModel
from anysr.ops.wavelet import WaveletGuide
from anysr.registry import MODEL_REGISTRY


def _set_requires_grad(net: nn.Module, flag: bool) -> None:
    for p in net.parameters():
        p.requires_grad_(flag)


@MODEL_REGISTRY.register()
class SRGANModel(SRModel):
    """``network_g`` trained with ``pixel_opt`` + ``perceptual_opt`` + ``gan_opt`` against ``network_d``.

    Per iteration: the generator step (every ``net_d_iters`` iterations, after ``net_d_init_iters``
    discriminator-only iterations), then the discriminator step. Besides the generator's, it reads the
    pretrained discriminator (``path.pretrain_network_g``, fresh runs) and the VGG19 weights of
    ``perceptual_opt`` (``weight_needs``; models do no file I/O).
    """

    uses_perceptual = True
    loss_roles = ("pixel", "perceptual", "learned", "artifact", "gan")
    loss_prefix = "l_g_"
    fsam_steps = True
    wavelet_discriminator = True  # train.wavelet_guided: its discriminator may judge wavelet bands instead
    clips_discriminator = True  # train.grad_clip_norm_d clips the discriminator's gradient norm

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.current_iter = 0
        if self.is_train:
            if not opt["network_d"]:
                raise OptionError(f"network_d: {type(self).__name__} needs a discriminator; add network_d "
                                  "(e.g. {type: VGGStyleDiscriminator, num_in_ch: 3, num_feat: 64})")
            self.nets["net_d"] = build_network(opt["network_d"], "network_d")

    # ---------------------------------------------------------------- the contract
    def weight_needs(self) -> list[WeightNeed]:
        needs = super().weight_needs()
        if not self.is_train:
            return needs
        # the generator's, the discriminator's, then the losses' (SRModel.weight_needs)
        return needs[:1] + self.discriminator_backbone_needs() + [self.discriminator_weight_need()] + needs[1:]

    def update_learning_rate(self, current_iter: int) -> None:
        self.current_iter = current_iter
        super().update_learning_rate(current_iter)

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        super().setup()
        if not self.is_train:
            return
        train = self.opt["train"]
        self.nets["net_d"] = self.acc.prepare_model(self.nets["net_d"])
        self.nets["net_d"].train()
        gans = [s for s in self.loss_specs if s.role == "gan"]
        if len(gans) != 1:
            where = "train.losses" if train["losses"] is not None else "train.gan_opt"
            raise OptionError(f"{where}: {type(self).__name__} needs exactly one GAN loss (found {len(gans)}); "
                              "add {type: GANLoss, gan_type: vanilla, loss_weight: 0.005}" if not gans else
                              f"{where}: {type(self).__name__} takes one GAN loss, found {len(gans)} "
                              f"({', '.join(s.key_path for s in gans)}); keep one")
        self.gan_name = self.loss_prefix + gans[0].name
        self.cri_gan = build_losses(gans, self.loss_state_dicts, self.acc.device)[gans[0].name]
        if not train["optim_d"]:
            raise OptionError("train.optim_d: the discriminator optimizer is missing; add e.g. "
                              "{type: Adam, lr: 1e-4, betas: [0.9, 0.99]}")
        self.add_optimizer("net_d", self.nets["net_d"], train["optim_d"], "train.optim_d")
        self.net_d_iters = int(train["net_d_iters"])
        self.net_d_init_iters = int(train["net_d_init_iters"])
        self.grad_clip_norm_d = train.get("grad_clip_norm_d")
        self.wavelet_guide = WaveletGuide().to(self.acc.device) if train.get("wavelet_guided") else None
        self.wavelet_init = int(train.get("wavelet_init") or 0)

    def discriminator_view(self, images: torch.Tensor) -> torch.Tensor:
        """What the discriminator judges of ``images`` (outputs or GTs): the images, or from ``train.wavelet_init``
        on with ``train.wavelet_guided`` their wavelet bands (neosr's ``wavelet_guided``; differentiable, so the
        generator's adversarial loss reaches the output through them)."""
        if self.wavelet_guide is None or self.current_iter < self.wavelet_init:
            return images
        return self.wavelet_guide(images)

    # ---------------------------------------------------------------- losses
    def generator_adv_loss(self, fake_pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """Adversarial loss of the generator given the discriminator's view of its output."""
        del gt
        return self.cri_gan(fake_pred, True, is_disc=False)

    def discriminator_backward(self, output: torch.Tensor, batch: dict[str, Any], scale: float,
                               sync: bool) -> dict[str, torch.Tensor]:
        """Backpropagate the discriminator losses of the micro-batch ``batch`` whose (detached) generator output
        is ``output`` (real, then fake: one backward per forward, as DDP wants); return ``l_d_real``,
        ``l_d_fake`` and the mean logits ``out_d_real``, ``out_d_fake``."""
        with torch.no_grad():
            gt, output = self.discriminator_view(batch["gt"]), self.discriminator_view(output)
        net_d = self.nets["net_d"]
        with self.acc.strategy.no_sync(net_d):
            with self.acc.precision.autocast():
                real = net_d(gt)
            l_real = self.cri_gan(real.float(), True, is_disc=True)
            self.acc.precision.backward(l_real * scale)
        with self.acc.strategy.no_sync(net_d) if not sync else contextlib.nullcontext():
            with self.acc.precision.autocast():
                fake = net_d(output)
            l_fake = self.cri_gan(fake.float(), False, is_disc=True)
            self.acc.precision.backward(l_fake * scale)
        return {"l_d_real": l_real, "l_d_fake": l_fake, "out_d_real": real.detach().float().mean(),
                "out_d_fake": fake.detach().float().mean()}

    def generator_losses(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with self.acc.precision.autocast():
            output = self.forward_g(batch["lq"])
        output = self.training_output(output)
        gt = batch["gt"]
        losses = self.loss_terms(output, batch["lq"], lambda role: gt)
        losses.update(self.adversarial_terms(batch, output))
        return output, losses

    def adversarial_terms(self, batch: dict[str, Any], output: torch.Tensor) -> dict[str, torch.Tensor]:
        """The generator's losses on the discriminator's view of ``output`` (``batch['gt']`` is the real side).
        The generator step does not update the discriminator: the bare module is called (no DDP reduction)."""
        fake_pred = self.bare("net_d")(self.discriminator_view(output))
        return {self.gan_name: self.generator_adv_loss(fake_pred, batch["gt"])}

    def judged_output(self, batch: dict[str, Any]) -> torch.Tensor:
        """The generator's output on ``batch`` without gradients, for a discriminator-only iteration."""
        with torch.no_grad(), self.acc.precision.autocast():
            return self.training_output(self.forward_g(batch["lq"]))

    # ---------------------------------------------------------------- the step
    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Generator step (when due) then discriminator step, over ``len(batches)`` micro-batches.

        Iterations without a generator step report the generator losses as 0 (the same keys every step).
        """
        batches = self.augment_batches(batches, ("gt", "l1_gt", "percep_gt"))
        n = len(batches)
        net_g = self.nets["net_g"]
        opt_g, opt_d = self.optimizers["net_g"], self.optimizers["net_d"]
        bare_d = self.bare("net_d")
        step_g = self.current_iter % self.net_d_iters == 0 and self.current_iter > self.net_d_init_iters
        totals: dict[str, torch.Tensor] = {}

        def add(values: dict[str, torch.Tensor]) -> None:
            for name, value in values.items():
                part = value.detach() / n
                totals[name] = totals[name] + part if name in totals else part

        outputs: list[torch.Tensor] = []
        _set_requires_grad(bare_d, False)
        if step_g:
            opt_g.zero_grad(set_to_none=True)

            def backward(log: bool = True) -> None:
                for k, batch in enumerate(batches):
                    with self.acc.strategy.no_sync(net_g) if k < n - 1 else contextlib.nullcontext():
                        output, losses = self.generator_losses(batch)
                        self.acc.precision.backward(sum(losses.values()) / n)  # type: ignore[arg-type]
                    if log:  # the discriminator judges the outputs at the weights (not FSAM's perturbed ones)
                        outputs.append(output.detach())
                        add(losses)

            backward()
            self.generator_step(opt_g, lambda: backward(False))
        else:
            outputs.extend(self.judged_output(batch) for batch in batches)
            zero = torch.zeros((), device=self.acc.device)
            totals.update({name: zero for name in [*self.loss_names(), self.gan_name]})

        _set_requires_grad(bare_d, True)
        opt_d.zero_grad(set_to_none=True)
        for k, (batch, output) in enumerate(zip(batches, outputs)):
            d_losses = self.discriminator_backward(output, batch, 1.0 / n, sync=k == n - 1)
            add(d_losses)
        self.acc.optimizer_step(opt_d, None if self.sam_active() else self.grad_clip_norm_d)
        self.update_emas()
        return totals


@MODEL_REGISTRY.register()
class ESRGANModel(SRGANModel):
    """SRGANModel with the relativistic average GAN of ESRGAN: each side is judged relative to the mean
    logit of the other (real vs. mean fake, fake vs. mean real), both halves weighted 0.5."""

    fsam_steps = True

    def generator_adv_loss(self, fake_pred: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            gt = self.discriminator_view(gt)
        return relativistic_generator_loss(self.cri_gan, self.bare("net_d")(gt), fake_pred)

    def discriminator_backward(self, output: torch.Tensor, batch: dict[str, Any], scale: float,
                               sync: bool) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            gt, output = self.discriminator_view(batch["gt"]), self.discriminator_view(output)
        net_d = self.nets["net_d"]
        with torch.no_grad(), self.acc.precision.autocast():
            fake_mean = self.bare("net_d")(output).float().mean()
        with self.acc.strategy.no_sync(net_d):
            with self.acc.precision.autocast():
                real = net_d(gt).float()
            l_real = relativistic_discriminator_loss(self.cri_gan, real, fake_mean)[0]  # fake_mean: no gradient
            self.acc.precision.backward(l_real * scale)
        with self.acc.strategy.no_sync(net_d) if not sync else contextlib.nullcontext():
            with self.acc.precision.autocast():
                fake = net_d(output).float()
            l_fake = relativistic_discriminator_loss(self.cri_gan, real.detach(), fake)[1]
            self.acc.precision.backward(l_fake * scale)
        return {"l_d_real": l_real, "l_d_fake": l_fake, "out_d_real": real.detach().mean(),
                "out_d_fake": fake.detach().mean()}
