"""StyleGAN2Model: BasicSR's unconditional StyleGAN2 training, for ``StyleGAN2Generator`` and
``StyleGAN2Discriminator`` on whole images (``FFHQDataset``).

Per iteration, as BasicSR 1.4.2's model: a discriminator step (the GAN loss, BasicSR's files: ``wgan_softplus``,
the logistic loss, on a fresh fake and the real batch; every ``net_d_reg_every`` iterations the R1 penalty
``r1_reg_weight / 2 * |grad D(real)|^2 * net_d_reg_every``), then a generator step (the non-saturating loss on a
fresh fake; every ``net_g_reg_every`` iterations the path length penalty on ``batch // path_batch_shrink``
images, times ``path_reg_weight * net_g_reg_every``), then the EMA generator (decay ``0.5 ** (32 / 10000)``, as
BasicSR, unless ``train.ema_decay`` sets another). Lazy regularisation scales each optimizer as the StyleGAN2
paper: ``lr * k / (k + 1)`` and ``betas ** (k / (k + 1))`` (betas (0, 0.99) unless given) with ``k`` the
regularisation interval. Style mixing with probability ``mixing_prob``.

Written for anysr: every random draw of a step (the codes, the mixing choice and layer, the noise maps, the path
length's projection) comes from a counter-based generator of (seed, iteration, micro-batch, purpose, rank), so a
resumed run continues exactly and nothing depends on the device's generator; the running mean of path lengths is
part of the training state. Validation draws ``val.num_val_samples`` images (16) of fixed codes from the EMA
generator (the trainer saves them as one grid per validation).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.stylegan2_arch import StyleGeneratorBase
from anysr.errors import DataError, OptionError
from anysr.losses import path_length_penalty, r1_penalty
from anysr.models.base import BaseModel, WeightNeed
from anysr.models.loss_set import LossSpec, StateDicts, build_losses, loss_specs
from anysr.registry import MODEL_REGISTRY, OPTIMIZER_REGISTRY

BASICSR_EMA_DECAY = 0.5 ** (32 / (10 * 1000))  # BasicSR's StyleGAN2Model: half-life of 10k images at batch 32
_TAG = 0x5747  # the model's streams: (seed, _TAG, purpose, iteration, micro, rank)
_FIXED, _D_STEP, _G_STEP, _PATH = 0, 1, 2, 3


def _set_requires_grad(net: nn.Module, flag: bool) -> None:
    for p in net.parameters():
        p.requires_grad_(flag)


def check_discriminator_size(net_d: nn.Module, out_size: int, source: str) -> None:
    """OptionError when a discriminator built for one image side (``out_size``: StyleGAN2's) is to judge images of
    another (``source`` names what sets their side); it raised in the first step's forward."""
    side = getattr(net_d, "out_size", None)
    if isinstance(side, int) and side != out_size:
        raise OptionError(f"network_d.out_size: {side}, but the images it judges are {out_size}x{out_size} ({source}); "
                          f"set network_d.out_size: {out_size}")


@MODEL_REGISTRY.register()
class StyleGAN2Model(BaseModel):
    """Unconditional StyleGAN2 (``network_g``: a StyleGAN2 generator, ``network_d``: its discriminator) trained
    on GT images alone; ``train``: ``gan_opt`` (``wgan_softplus``), ``r1_reg_weight``, ``path_reg_weight``,
    ``path_batch_shrink``, ``net_g_reg_every``, ``net_d_reg_every``, ``mixing_prob``."""

    generative = True  # trains from images alone and is validated by samples (the options and trainer read it)
    loss_roles: tuple[str, ...] = ("gan",)

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        net_g = build_network(opt["network_g"])
        if not isinstance(net_g, StyleGeneratorBase):
            raise OptionError(f"network_g.type: StyleGAN2Model trains a StyleGAN2 generator (StyleGAN2Generator, "
                              f"StyleGAN2GeneratorClean), got {opt['network_g']['type']}")
        self.nets["net_g"] = net_g
        self.num_style_feat = int(net_g.num_style_feat)
        self.out_size = 2 ** int(net_g.log_size)
        self.num_latent = int(net_g.num_latent)
        self.noise_sides = [4] + [2**i for i in range(3, int(net_g.log_size) + 1) for _ in range(2)]
        self.current_iter = 0
        self.loss_specs: list[LossSpec] = []
        self.loss_state_dicts: dict[str, StateDicts] = {}
        self.mean_path_length = torch.zeros(())
        val = opt.get("val") or {}
        self.num_val_samples = int(val.get("num_val_samples") or 16)
        if self.is_train:
            if not opt["network_d"]:
                raise OptionError("network_d: StyleGAN2Model needs a discriminator; add network_d "
                                  "(e.g. {type: StyleGAN2Discriminator, out_size: 256, channel_multiplier: 2})")
            self.nets["net_d"] = build_network(opt["network_d"], "network_d")
            check_discriminator_size(self.nets["net_d"], self.out_size, "network_g.out_size")
            train = opt["train"]
            self.loss_specs = loss_specs(train, type(self).__name__, type(self).loss_roles)
            self.r1_weight = float(train["r1_reg_weight"])
            self.path_weight = float(train["path_reg_weight"])
            self.path_shrink = int(train["path_batch_shrink"])
            self.g_every = int(train["net_g_reg_every"])
            self.d_every = int(train["net_d_reg_every"])
            self.mixing_prob = float(train["mixing_prob"])

    # ---------------------------------------------------------------- the contract
    def weight_needs(self) -> list[WeightNeed]:
        needs = super().weight_needs()
        if not self.is_train:
            return needs
        return needs + [self.discriminator_weight_need()]

    def input_shape(self, batch: int, channels: int, size: int) -> tuple[int, ...]:
        return (batch, channels, self.out_size, self.out_size)

    def update_learning_rate(self, current_iter: int) -> None:
        self.current_iter = current_iter
        super().update_learning_rate(current_iter)

    def setup(self) -> None:
        self.nets["net_g"] = self.acc.prepare_model(self.nets["net_g"])
        self.mean_path_length = torch.zeros((), device=self.acc.device)
        if not self.is_train:
            self.nets["net_g"].eval()
            return
        train = self.opt["train"]
        self.nets["net_g"].train()
        self.add_ema("net_g", float(train["ema_decay"]) or BASICSR_EMA_DECAY, train)
        self.nets["net_d"] = self.acc.prepare_model(self.nets["net_d"])
        self.nets["net_d"].train()
        if len(self.loss_specs) != 1:
            raise OptionError("train.gan_opt: StyleGAN2Model trains with exactly one GAN loss; set gan_opt "
                              "(e.g. {type: GANLoss, gan_type: wgan_softplus, loss_weight: 1})")
        spec = self.loss_specs[0]
        self.gan_name = "l_g" if spec.name == "gan" else f"l_g_{spec.name}"  # BasicSR's log name
        self.cri_gan = build_losses(self.loss_specs, self.loss_state_dicts, self.acc.device)[spec.name]
        if not train["optim_d"]:
            raise OptionError("train.optim_d: the discriminator optimizer is missing; add e.g. {type: Adam, lr: 2e-3}")
        for name, key, every in (("net_g", "optim_g", self.g_every), ("net_d", "optim_d", self.d_every)):
            self.add_optimizer(name, self.nets[name], _lazy_regularised(train[key], every, f"train.{key}"),
                               f"train.{key}")

    # ---------------------------------------------------------------- randomness
    def _rng(self, purpose: int, micro: int = 0, *, rank: bool = True) -> np.random.Generator:
        it = 0 if purpose == _FIXED else self.current_iter
        return np.random.default_rng([int(self.opt["manual_seed"]), _TAG, purpose, it, micro,
                                      self.acc.rank if rank else 0])

    def codes(self, batch: int, purpose: int, micro: int = 0) -> dict[str, Any]:
        """The generator's inputs for ``batch`` images of this iteration's step ``purpose``: two code batches and
        the layer the second starts at (style mixing; ``num_latent`` when this draw does not mix), the per-layer
        noise maps; on the device."""
        rng = self._rng(purpose, micro)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        mix = rng.random() < self.mixing_prob
        # Two codes always, the mixing layer as data (num_latent: no mixing): one graph for every draw (XLA).
        styles = [torch.randn(batch, self.num_style_feat, generator=gen) for _ in range(2)]
        inject = torch.tensor(int(rng.integers(1, self.num_latent)) if mix else self.num_latent)
        noise = [torch.randn(batch, 1, s, s, generator=gen) for s in self.noise_sides]
        out = {"styles": self.acc.to_device(styles), "inject_index": self.acc.to_device(inject),
               "mixed": mix, "noise": self.acc.to_device(noise)}
        if purpose == _PATH:  # the path length's random image-space direction
            out["projection"] = self.acc.to_device(torch.randn(batch, 3, self.out_size, self.out_size, generator=gen))
        return out

    def _generate(self, net: nn.Module, batch: int, purpose: int, micro: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """Images of ``batch`` codes of step ``purpose`` (and the inputs, with the latents when ``_PATH``)."""
        c = self.codes(batch, purpose, micro)
        with self.acc.precision.autocast():
            image, c["latents"] = net(c["styles"], noise=c["noise"], inject_index=c["inject_index"],
                                      return_latents=purpose == _PATH)
        return image.float(), c

    # ---------------------------------------------------------------- the step
    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The discriminator step, then the generator step, each over ``len(batches)`` micro-batches."""
        it, n = self.current_iter, len(batches)
        net_g, net_d = self.nets["net_g"], self.nets["net_d"]
        bare_g, bare_d = self.bare("net_g"), self.bare("net_d")
        opt_g, opt_d = self.optimizers["net_g"], self.optimizers["net_d"]
        reg_d, reg_g = it % self.d_every == 0, it % self.g_every == 0
        totals: dict[str, torch.Tensor] = {}
        zero = torch.zeros((), device=self.acc.device)

        def add(name: str, value: torch.Tensor) -> None:
            part = value.detach().float() / n
            totals[name] = totals[name] + part if name in totals else part

        # discriminator: fake and real (a backward after each forward, as DDP wants), then R1 when due
        _set_requires_grad(bare_d, True)
        opt_d.zero_grad(set_to_none=True)
        for k, batch in enumerate(batches):
            real = self._real(batch)
            b = real.shape[0]
            last = k == n - 1
            with torch.no_grad():
                fake, _ = self._generate(bare_g, b, _D_STEP, k)
            with self.acc.strategy.no_sync(net_d):
                with self.acc.precision.autocast():
                    fake_pred = net_d(fake).float()
                l_fake = self.cri_gan(fake_pred, False, is_disc=True)
                self.acc.precision.backward(l_fake / n)
            with self.acc.strategy.no_sync(net_d) if not last or reg_d else contextlib.nullcontext():
                with self.acc.precision.autocast():
                    real_pred = net_d(real).float()
                l_real = self.cri_gan(real_pred, True, is_disc=True)
                self.acc.precision.backward(l_real / n)
            add("l_d", l_real + l_fake)
            add("real_score", real_pred.mean())
            add("fake_score", fake_pred.mean())
            if reg_d:
                with self.acc.strategy.no_sync(net_d) if not last else contextlib.nullcontext():
                    real = real.detach().requires_grad_(True)
                    real_pred = net_d(real)  # fp32: a gradient penalty in low precision is noise
                    r1 = r1_penalty(real_pred, real)
                    l_r1 = self.r1_weight / 2 * r1 * self.d_every + 0 * real_pred[0].sum()
                    self.acc.precision.backward(l_r1 / n)
                add("l_d_r1", l_r1)
            else:
                add("l_d_r1", zero)
        self.acc.optimizer_step(opt_d)

        # generator: the non-saturating loss, then the path length penalty when due
        _set_requires_grad(bare_d, False)
        opt_g.zero_grad(set_to_none=True)
        for k, batch in enumerate(batches):
            b = batch["gt"].shape[0]
            last = k == n - 1
            with self.acc.strategy.no_sync(net_g) if not last or reg_g else contextlib.nullcontext():
                fake, _ = self._generate(net_g, b, _G_STEP, k)
                with self.acc.precision.autocast():
                    pred = bare_d(fake).float()
                l_g = self.cri_gan(pred, True, is_disc=False)
                self.acc.precision.backward(l_g / n)
            add(self.gan_name, l_g)
            if reg_g:
                with self.acc.strategy.no_sync(net_g) if not last else contextlib.nullcontext():
                    path_b = max(1, b // self.path_shrink)
                    fake, c = self._generate(net_g, path_b, _PATH, k)
                    penalty, lengths, self.mean_path_length = path_length_penalty(
                        fake, c["latents"], self.mean_path_length, c["projection"])
                    l_path = self.path_weight * self.g_every * penalty + 0 * fake[0, 0, 0, 0]
                    self.acc.precision.backward(l_path / n)
                add("l_g_path", l_path)
                add("path_length", lengths)
            else:
                add("l_g_path", zero)
                add("path_length", zero)
        self.acc.optimizer_step(opt_g)
        _set_requires_grad(bare_d, True)
        self.update_emas()
        return totals

    def _real(self, batch: dict[str, Any]) -> torch.Tensor:
        real = batch["gt"]
        if tuple(real.shape[-2:]) != (self.out_size, self.out_size):
            raise DataError(f"StyleGAN2Model: the training images are {real.shape[-1]}x{real.shape[-2]} but "
                            f"network_g.out_size is {self.out_size}; resize the images or set out_size to their "
                            "size")
        return real

    # ---------------------------------------------------------------- samples, state
    @torch.no_grad()
    def sample_images(self) -> torch.Tensor:
        """``num_val_samples`` images of fixed codes (the same every validation and run) from the EMA generator
        (the generator without EMA), in [0, 1] (the network's [-1, 1] mapped), on the host."""
        rng = self._rng(_FIXED, rank=False)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        styles = torch.randn(self.num_val_samples, self.num_style_feat, generator=gen)
        noise = [torch.randn(self.num_val_samples, 1, s, s, generator=gen) for s in self.noise_sides]
        net = self.inference_net()
        was = net.training
        net.eval()
        try:
            image, _ = net([self.acc.to_device(styles)], noise=self.acc.to_device(noise))
        finally:
            net.train(was)
        return ((self.acc.to_host(image).float() + 1) / 2).clamp(0, 1)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "mean_path_length": self.mean_path_length.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "mean_path_length" in state:
            self.mean_path_length = self.acc.to_device(torch.as_tensor(state["mean_path_length"]).float())


def _lazy_regularised(opt: Any, every: int, key_path: str) -> dict[str, Any]:
    """The optimizer options with StyleGAN2's lazy-regularisation correction: ``lr * r`` and, for an optimizer
    taking ``betas``, ``betas ** r`` (StyleGAN2's (0, 0.99) unless given), ``r = every / (every + 1)``."""
    out = dict(opt)
    ratio = every / (every + 1)
    out["lr"] = float(out["lr"]) * ratio
    cls = OPTIMIZER_REGISTRY.get(str(out["type"]), f"{key_path}.type")
    try:
        takes_betas = "betas" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        takes_betas = False
    if takes_betas:
        b1, b2 = out.get("betas") or (0.0, 0.99)
        out["betas"] = [float(b1) ** ratio, float(b2) ** ratio]
    return out


__all__ = ["BASICSR_EMA_DECAY", "StyleGAN2Model"]
