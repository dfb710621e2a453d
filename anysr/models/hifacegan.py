"""HiFaceGANModel: BasicSR's training model for HiFaceGAN, a generator judged by a conditional multi-scale
discriminator with feature matching."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from anysr.archs.arch_util import nearest_upsample
from anysr.archs.hifacegan_arch import HiFaceGAN
from anysr.errors import OptionError
from anysr.models.gan import SRGANModel
from anysr.models.loss_set import build_losses
from anysr.registry import MODEL_REGISTRY

Prediction = list[Any] | torch.Tensor  # a multi-scale discriminator's list (of feature lists), or one tensor


def _halves(pred: Prediction) -> tuple[Prediction, Prediction]:
    """The first and second half of the batch of every tensor in a discriminator's output."""
    if isinstance(pred, torch.Tensor):
        n = pred.shape[0] // 2
        return pred[:n], pred[n:]
    parts = [_halves(p) for p in pred]
    return [a for a, _ in parts], [b for _, b in parts]


def _scores(pred: Prediction) -> torch.Tensor:
    """The mean of the final scores of every scale (for the log)."""
    if isinstance(pred, torch.Tensor):
        return pred.detach().float().mean()
    return torch.stack([_scores(p if isinstance(p, torch.Tensor) else p[-1]) for p in pred]).mean()


def _float(pred: Prediction) -> Prediction:
    return pred.float() if isinstance(pred, torch.Tensor) else [_float(p) for p in pred]


@MODEL_REGISTRY.register()
class HiFaceGANModel(SRGANModel):
    """BasicSR's HiFaceGANModel: ``network_g`` trained with ``pixel_opt`` / ``perceptual_opt``, ``gan_opt``
    (``MultiScaleGANLoss``) and ``feature_matching_opt`` (``GANFeatLoss``) against ``network_d``
    (``HiFaceGANDiscriminator``).

    The discriminator sees the fake and the real image in one batch (as the authors: batch-normalised
    discriminators see both in the same statistics), each stacked on channels with the input when it is
    conditional (``conditional_d``; an input of another size is first upsampled to the output's, nearest). The
    discriminator's loss is the mean of its real and fake terms. Unlike BasicSR, ``train.ema_decay`` works here
    (BasicSR refuses it), and either of pixel_opt / perceptual_opt may be left out only if the other is set.
    """

    loss_roles = ("pixel", "perceptual", "learned", "artifact", "gan", "feature_matching")
    wavelet_discriminator = False  # its discriminator sees fake and real in one batch (train.wavelet_guided: no)

    def setup(self) -> None:
        super().setup()
        if not self.is_train:
            return
        if not any(s.role in ("pixel", "perceptual") for s in self.loss_specs):
            raise OptionError("train: HiFaceGANModel needs a pixel or a perceptual loss besides the GAN loss; add "
                              "train.perceptual_opt (BasicSR's HiFaceGAN file) or train.pixel_opt")
        feats = [s for s in self.loss_specs if s.role == "feature_matching"]
        if len(feats) > 1:
            raise OptionError(f"{feats[1].key_path}: HiFaceGANModel takes one feature-matching loss, found "
                              f"{len(feats)}; keep one")
        self.feat_name = self.loss_prefix + feats[0].name if feats else None
        self.cri_feat = build_losses(feats, self.loss_state_dicts, self.acc.device)[feats[0].name] if feats else None
        self.conditional = bool(getattr(self.bare("net_d"), "conditional", False))
        self._check_crop_size()

    def _check_crop_size(self) -> None:
        """HiFaceGAN's instance norms need 2x2 values at 1/32 of its (padded) input: a train crop too small for that
        fails in the first step's forward; said here, before training, naming the key."""
        net = self.bare("net_g")
        if not isinstance(net, HiFaceGAN):
            return
        least, multiple = 2 * net.tile_multiple, net.tile_multiple
        scale = int(self.opt.get("scale") or 1)
        for key, ds in self.opt["datasets"].items():
            size = ds.get("gt_size") if key.startswith("train") else None
            if isinstance(size, int) and -(-(size // scale) // multiple) * multiple < least:
                raise OptionError(f"datasets.{key}.gt_size: HiFaceGAN trains on input crops of at least {least}x"
                                  f"{least} (its instance norms need 2x2 values at 1/32 of the size), got "
                                  f"{size // scale}x{size // scale}; raise gt_size to {least * scale} or more")

    def loss_names(self) -> list[str]:
        return super().loss_names() + ([self.feat_name] if self.feat_name else [])

    def discriminator_input(self, lq: torch.Tensor, output: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """The discriminator's batch: the fake image, then the real one, each with the input when conditional."""
        if not self.conditional:
            return torch.cat([output, gt], dim=0)
        if lq.shape[-2:] != output.shape[-2:]:
            factor = output.shape[-1] // lq.shape[-1]
            if factor * lq.shape[-1] != output.shape[-1] or factor * lq.shape[-2] != output.shape[-2]:
                raise ValueError(f"HiFaceGANModel: the output ({tuple(output.shape[-2:])}) is not an integer "
                                 f"multiple of the input ({tuple(lq.shape[-2:])})")
            lq = nearest_upsample(lq, factor)
        return torch.cat([torch.cat([lq, output], dim=1), torch.cat([lq, gt], dim=1)], dim=0)

    def adversarial_terms(self, batch: dict[str, Any], output: torch.Tensor) -> dict[str, torch.Tensor]:
        """The GAN loss on the fake half and feature matching against the real half of one discriminator pass."""
        with self.acc.precision.autocast():  # the bare module: the generator step does not update the discriminator
            pred = self.bare("net_d")(self.discriminator_input(batch["lq"], output, batch["gt"]))
        fake, real = _halves(_float(pred))
        terms = {self.gan_name: self.cri_gan(fake, True, is_disc=False)}
        if self.cri_feat is not None:
            terms[self.feat_name] = self.cri_feat(fake, real)
        return terms

    def discriminator_backward(self, output: torch.Tensor, batch: dict[str, Any], scale: float,
                               sync: bool) -> dict[str, torch.Tensor]:
        """One discriminator forward on the fake and the real half; backpropagates the mean of their losses."""
        net_d = self.nets["net_d"]
        with self.acc.strategy.no_sync(net_d) if not sync else contextlib.nullcontext():
            with self.acc.precision.autocast():
                pred = net_d(self.discriminator_input(batch["lq"], output.detach(), batch["gt"]))
            fake, real = _halves(_float(pred))
            l_real = self.cri_gan(real, True, is_disc=True)
            l_fake = self.cri_gan(fake, False, is_disc=True)
            self.acc.precision.backward((l_real + l_fake) / 2 * scale)
        return {"l_d_real": l_real, "l_d_fake": l_fake, "out_d_real": _scores(real), "out_d_fake": _scores(fake)}
