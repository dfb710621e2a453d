"""Adversarial loss with BasicSR's arguments (``gan_type``, label values, ``loss_weight``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.registry import LOSS_REGISTRY

GAN_TYPES = ("vanilla", "lsgan", "wgan", "wgan_softplus", "hinge")


@LOSS_REGISTRY.register()
class GANLoss(nn.Module):
    """GAN loss on discriminator outputs (logits).

    ``vanilla``: binary cross-entropy with logits; ``lsgan``: mean squared error to the label value;
    ``wgan``: -mean (real) / mean (fake); ``wgan_softplus``: softplus(-x) / softplus(x);
    ``hinge``: relu(1 - x) / relu(1 + x) for the discriminator, -mean(x) for the generator.
    ``loss_weight`` scales only generator losses (``is_disc=False``), as in BasicSR.
    """

    role = "gan"  # which train.*_opt accepts it (the options read this)

    def __init__(self, gan_type: str = "vanilla", real_label_val: float = 1.0, fake_label_val: float = 0.0,
                 loss_weight: float = 1.0) -> None:
        super().__init__()
        if gan_type not in GAN_TYPES:
            raise ValueError(f"gan_type '{gan_type}' is not supported; use one of {', '.join(GAN_TYPES)}")
        self.gan_type = gan_type
        self.real_label_val = float(real_label_val)
        self.fake_label_val = float(fake_label_val)
        self.loss_weight = float(loss_weight)

    def _labelled(self, x: torch.Tensor, target_is_real: bool) -> torch.Tensor:
        target = torch.full_like(x, self.real_label_val if target_is_real else self.fake_label_val)
        if self.gan_type == "vanilla":
            return F.binary_cross_entropy_with_logits(x, target)
        return F.mse_loss(x, target)

    def forward(self, input: torch.Tensor, target_is_real: bool, is_disc: bool = False) -> torch.Tensor:  # noqa: A002
        """The loss of ``input`` judged against the real (``True``) or fake label."""
        x = input
        if self.gan_type in ("vanilla", "lsgan"):
            loss = self._labelled(x, target_is_real)
        elif self.gan_type == "wgan":
            loss = -x.mean() if target_is_real else x.mean()
        elif self.gan_type == "wgan_softplus":
            loss = F.softplus(-x).mean() if target_is_real else F.softplus(x).mean()
        elif is_disc:  # hinge, discriminator side
            loss = F.relu(1 - x).mean() if target_is_real else F.relu(1 + x).mean()
        else:  # hinge, generator side
            loss = -x.mean()
        return loss if is_disc else loss * self.loss_weight
