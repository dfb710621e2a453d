"""Adversarial losses with BasicSR's arguments (``gan_type``, label values, ``loss_weight``), the multi-scale form,
the relativistic average form ESRGAN trains with, and the R1 / WGAN-GP gradient penalties."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import autograd, nn
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


@LOSS_REGISTRY.register()
class MultiScaleGANLoss(GANLoss):
    """GANLoss over a list of discriminator outputs (one per scale), averaged; an entry that is itself a list
    (multi-scale feature matching) contributes its last element. A single tensor is judged as by GANLoss."""

    def forward(self, input: torch.Tensor | Sequence[torch.Tensor | Sequence[torch.Tensor]],  # type: ignore[override]  # noqa: A002
                target_is_real: bool, is_disc: bool = False) -> torch.Tensor:
        """The mean over scales of GANLoss of each scale's output."""
        if isinstance(input, torch.Tensor):
            return super().forward(input, target_is_real, is_disc)
        if len(input) == 0:
            raise ValueError("MultiScaleGANLoss got an empty list of discriminator outputs")
        total = sum(super(MultiScaleGANLoss, self).forward(p if isinstance(p, torch.Tensor) else p[-1],
                                                            target_is_real, is_disc).mean() for p in input)
        return total / len(input)  # type: ignore[return-value]


_FEAT_CRITERIA = ("l1", "l2", "charbonnier")


@LOSS_REGISTRY.register()
class GANFeatLoss(nn.Module):
    """Feature matching (pix2pixHD, SPADE, HiFaceGAN): the distance between the discriminator's intermediate
    features of the generated and of the real image (real side detached), summed over layers, averaged over the
    discriminators of a multi-scale one; the last entry of each list (the scores) is left out.

    ``criterion``: l1, l2 (mean squared error) or charbonnier (eps 1e-12). ``loss_weight`` scales the sum once, as
    the authors' ``lambda_feat``. (BasicSR <= 1.3's class of this name applied it twice, weight squared, and
    1.4.2 no longer has the class, though its HiFaceGAN option file names it.)
    """

    role = "feature_matching"  # train.feature_matching_opt (HiFaceGANModel)

    def __init__(self, criterion: str = "l1", loss_weight: float = 1.0, reduction: str = "mean") -> None:
        super().__init__()
        if criterion not in _FEAT_CRITERIA:
            raise ValueError(f"criterion '{criterion}' is not supported; use one of {', '.join(_FEAT_CRITERIA)}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction '{reduction}' is not supported; use mean or sum")
        self.criterion = criterion
        self.loss_weight = float(loss_weight)
        self.reduction = reduction

    def _distance(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        diff = fake.float() - real.float()
        if self.criterion == "l1":
            d = diff.abs()
        elif self.criterion == "l2":
            d = diff.square()
        else:
            d = torch.sqrt(diff.square() + 1e-12)
        return d.mean() if self.reduction == "mean" else d.sum()

    def forward(self, pred_fake: Sequence[Sequence[torch.Tensor]],
                pred_real: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
        """The weighted feature distance; each argument is the discriminator's list (per scale) of feature lists."""
        if len(pred_fake) != len(pred_real) or not pred_fake:
            raise ValueError("GANFeatLoss needs the same non-empty number of discriminator outputs for both sides")
        total = pred_fake[0][0].new_zeros((), dtype=torch.float32)
        for fake, real in zip(pred_fake, pred_real, strict=True):
            if isinstance(fake, torch.Tensor) or len(fake) < 2:
                raise ValueError("GANFeatLoss needs the discriminator's intermediate features (a list per scale "
                                 "ending with the scores); set keep_features: true on network_d")
            for f, r in zip(fake[:-1], real[:-1], strict=True):
                total = total + self._distance(f, r.detach()) / len(pred_fake)
        return total * self.loss_weight


def relativistic_generator_loss(gan: GANLoss, real_pred: torch.Tensor, fake_pred: torch.Tensor) -> torch.Tensor:
    """ESRGAN's relativistic average generator loss: the mean of ``gan(real - mean(fake), fake label)`` and
    ``gan(fake - mean(real), real label)``; ``real_pred`` is detached (the discriminator is not trained here)."""
    real_pred = real_pred.detach()
    l_real = gan(real_pred - fake_pred.mean(), False, is_disc=False)
    l_fake = gan(fake_pred - real_pred.mean(), True, is_disc=False)
    return (l_real + l_fake) / 2


def relativistic_discriminator_loss(gan: GANLoss, real_pred: torch.Tensor,
                                    fake_pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ESRGAN's relativistic average discriminator losses ``(real, fake)``, each halved as ESRGAN does; the other
    side's mean is detached. ``fake_pred`` is D's output on the detached generator output."""
    l_real = gan(real_pred - fake_pred.detach().mean(), True, is_disc=True) * 0.5
    l_fake = gan(fake_pred - real_pred.detach().mean(), False, is_disc=True) * 0.5
    return l_real, l_fake


def r1_penalty(real_pred: torch.Tensor, real_img: torch.Tensor) -> torch.Tensor:
    """R1 regulariser (Mescheder et al. 2018, eq. 9): the batch mean of the squared norm of d sum(D(x)) / dx at
    real images. ``real_img`` must require grad and ``real_pred`` be computed from it; the graph is kept so the
    penalty can be back-propagated. Scale it (gamma / 2) at the caller."""
    grad = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)[0]
    return grad.pow(2).reshape(grad.shape[0], -1).sum(1).mean()


def path_length_penalty(fake_img: torch.Tensor, latents: torch.Tensor, mean_path_length: torch.Tensor,
                        noise: torch.Tensor, decay: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """StyleGAN2's path length regulariser (Karras et al. 2020, eq. 4) as BasicSR's ``g_path_regularize``:
    ``(|J^T y| - a)^2`` with ``J`` the Jacobian of the image w.r.t. the per-layer latents, ``y`` = ``noise``
    (standard normal, the image's shape; divided here by sqrt(H * W)) and ``a`` the running mean of the lengths
    (``mean_path_length``, updated with ``decay``). Returns ``(penalty, mean length, new running mean)``; the graph
    is kept so the penalty can be back-propagated."""
    y = noise / math.sqrt(fake_img.shape[2] * fake_img.shape[3])
    grad = autograd.grad(outputs=(fake_img * y).sum(), inputs=latents, create_graph=True)[0]
    lengths = torch.sqrt(grad.pow(2).sum(2).mean(1))
    path_mean = mean_path_length + decay * (lengths.mean() - mean_path_length)
    return (lengths - path_mean).pow(2).mean(), lengths.detach().mean(), path_mean.detach()


def gradient_penalty_loss(discriminator: Callable[[torch.Tensor], torch.Tensor], real_data: torch.Tensor,
                          fake_data: torch.Tensor, weight: torch.Tensor | None = None,
                          alpha: torch.Tensor | None = None) -> torch.Tensor:
    """WGAN-GP penalty as BasicSR computes it: mean over pixels of (||grad D(x_hat)||_2 over channels - 1)^2 at
    ``x_hat = alpha * real + (1 - alpha) * fake``. ``alpha`` (N, 1, 1, 1) defaults to a uniform draw on the data's
    device (give it to make the draw reproducible); ``weight`` multiplies the gradients and the penalty is then
    divided by the weight's mean."""
    if alpha is None:
        alpha = torch.rand(real_data.shape[0], 1, 1, 1, device=real_data.device, dtype=real_data.dtype)
    interp = (alpha * real_data + (1.0 - alpha) * fake_data).detach().requires_grad_(True)
    d = discriminator(interp)
    grad = autograd.grad(outputs=d, inputs=interp, grad_outputs=torch.ones_like(d), create_graph=True)[0]
    if weight is not None:
        grad = grad * weight
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    return penalty if weight is None else penalty / weight.mean()
