"""RestoreFormerModel: RestoreFormer / RestoreFormer++'s training as their authors run it (wzhouxiff/
RestoreFormerPlusPlus: ``RestoreFormerModel`` with ``VQLPIPSWithDiscriminatorWithCompWithIdentity``), both stages.

Stage 1 (the HQ dictionary, ``VQVAEGAN`` autoencoding high-quality faces: ``train.image_key: gt``) and stage 2
(``RestoreFormer`` / ``RestoreFormerPlusPlus`` restoring the LQ face: ``image_key: lq``, started from stage 1's
weights with ``path.strict_load_g: false``, as the authors' ``init_from_ckpt``: the layers stage 1 lacks are logged
as not pre-trained). One iteration is the authors' Lightning step, optimizer by optimizer:

- the generator (their optimizer 0): ``pixelloss_weight`` x L1 + ``perceptual_weight`` x LPIPS (VGG, their
  ``lpips.py``) as the ``nll`` loss, plus the hinge generator loss ``-mean(D(x_rec))`` times the adaptive weight
  (``|grad nll| / (|grad g| + 1e-4)`` at the decoder's last conv, clamped to [0, 1e4], times ``disc_weight``; the
  quantiser's input conv with ``fix_decoder``) and ``disc_factor`` from iteration ``disc_start`` on, plus
  ``codebook_weight`` x the quantiser's loss, plus ``lpips_style_weight`` x LPIPS' Gram style term; after
  ``disc_start`` also the three facial-component GAN losses (``comp_weight``, ``comp_disc_loss``) with their
  Gram style losses (``comp_style_weight``) and the ArcFace identity loss (``identity_weight``);
- the PatchGAN discriminator (optimizer 1): ``disc_factor`` x the hinge (or vanilla) loss of the GT and of the
  output of the generator *after* its update (Lightning runs the step again per optimizer), weighted 0 before
  ``disc_start`` (its optimizer still steps, as theirs);
- from iteration ``disc_start`` on the three component discriminators (optimizers 2-4), ``comp_disc_loss`` on the
  crops of that output and of the GT.

The authors' ``global_step`` counts from 0: iteration ``i`` here is their step ``i - 1``. Optimizers: ``optim_g``
with ``special_params_lr_scale`` x its lr for the decoder's attention (their ``'decoder' in name and 'attn' in
name``), ``optim_d``, and ``optim_component`` (by default Adam, betas (0.9, 0.99), ``optim_g``'s lr x
``comp_params_lr_scale``). Images: the losses in the authors' [-1, 1].
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators import Accelerator
from anysr.errors import DataError, OptionError
from anysr.losses import build_loss
from anysr.losses.learned import lpips_with_style
from anysr.losses.perceptual import gram_matrix
from anysr.metrics.info import standard_weights
from anysr.metrics.lpips import LPIPS
from anysr.models.base import WeightNeed
from anysr.models.gan import SRGANModel, _set_requires_grad
from anysr.models.gfpgan import EYE_SIZE, MOUTH_SIZE, PARTS, FaceParts, _with_default_betas
from anysr.registry import MODEL_REGISTRY, plain_options

# what the step logs, the authors' names (without their "train/"), the same keys every iteration
G_LOGS = ("quant_loss", "nll_loss", "rec_loss", "p_loss", "p_style_loss", "d_weight", "disc_factor", "g_loss")
D_LOGS = ("disc_loss", "logits_real", "logits_fake")
PART_LOG = {"left_eye": "left", "right_eye": "right", "mouth": "mouth"}
SPECIAL_PARAMS = "*decoder*attn*"  # the authors' special group: 'decoder' in name and 'attn' in name


def hinge_d_loss(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """VQGAN's hinge discriminator loss ``0.5 * (mean(relu(1 - real)) + mean(relu(1 + fake)))``."""
    return _hinge_real(real) + _hinge_fake(fake)


def vanilla_d_loss(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """VQGAN's vanilla discriminator loss ``0.5 * (mean(softplus(-real)) + mean(softplus(fake)))``."""
    return _vanilla_real(real) + _vanilla_fake(fake)


def _hinge_real(real: torch.Tensor) -> torch.Tensor:
    return 0.5 * F.relu(1.0 - real).mean()


def _hinge_fake(fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * F.relu(1.0 + fake).mean()


def _vanilla_real(real: torch.Tensor) -> torch.Tensor:
    return 0.5 * F.softplus(-real).mean()


def _vanilla_fake(fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * F.softplus(fake).mean()


# each loss as its real and fake halves (one backward per discriminator forward, as DDP wants)
D_LOSSES = {"hinge": (_hinge_real, _hinge_fake), "vanilla": (_vanilla_real, _vanilla_fake)}


def taming_init(net: nn.Module) -> None:
    """The authors' discriminator initialisation (taming's ``weights_init``): conv weights N(0, 0.02), batch-norm
    weights N(1, 0.02) and biases 0."""
    for m in net.modules():
        name = type(m).__name__
        if "Conv" in name and getattr(m, "weight", None) is not None:
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif "BatchNorm" in name and getattr(m, "weight", None) is not None:
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


@MODEL_REGISTRY.register()
class RestoreFormerModel(FaceParts, SRGANModel):
    """RestoreFormer / RestoreFormer++ (and their HQ dictionary ``VQVAEGAN``) against a PatchGAN discriminator
    (``PatchGAN`` with ``norm_type: batch, use_sn: false``: taming's ``NLayerDiscriminator``), with optional
    facial-component discriminators and identity loss; train keys as the authors' loss: ``image_key``,
    ``disc_start``, ``disc_weight``, ``disc_factor``, ``disc_loss``, ``codebook_weight``, ``pixelloss_weight``,
    ``perceptual_weight``, ``lpips_style_weight``, ``comp_weight``, ``comp_style_weight``, ``comp_disc_loss``,
    ``identity_weight``, ``special_params_lr_scale``, ``comp_params_lr_scale``, ``lpips_weights``."""

    loss_roles = ()  # the authors' loss, from its own keys (no pixel_opt / perceptual_opt / gan_opt)
    default_scale = 1
    signed_images = True
    takes_image_source = True  # stage 1 autoencodes GT faces: FFHQDataset's images alone will do
    extra_networks = (*(f"network_d_{p}" for p in PARTS), "network_identity")

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        net_g = self.nets["net_g"]
        if not hasattr(net_g, "quantize") or not hasattr(net_g, "decoder"):
            raise OptionError(f"network_g.type: RestoreFormerModel trains VQVAEGAN, RestoreFormer or "
                              f"RestoreFormerPlusPlus, got {opt['network_g']['type']}")
        self.build_face_networks()
        self.lpips_state_dicts: list[Mapping[str, torch.Tensor]] = []
        if self.is_train:
            taming_init(self.nets["net_d"])  # before any weights file: a pretrained discriminator overwrites it

    # ---------------------------------------------------------------- the contract
    def weight_needs(self) -> list[WeightNeed]:
        """The generator's and discriminator's weights, the component discriminators', ArcFace's, LPIPS' (VGG16
        and the lpips head: ``train.lpips_weights``, else the standard files found by name)."""
        needs = [self._codebook_checked(n) if n.option == "path.pretrain_network_g" else n
                 for n in super().weight_needs()] + self.face_weight_needs()
        if not self.is_train or float(self.opt["train"]["perceptual_weight"]) <= 0:
            return needs
        store = self.lpips_state_dicts

        def keep(sd: Mapping[str, torch.Tensor], load: Any) -> None:
            del load
            store.append(sd)

        files = self.opt["train"].get("lpips_weights") or []
        for i, f in enumerate(files):
            needs.append(WeightNeed(f"lpips weights[{i}]", "train.lpips_weights", str(f), keep, param_key="auto",
                                    required=True, fresh_only=False))
        for known in standard_weights("lpips", "vgg") if not files else ():
            needs.append(WeightNeed(f"lpips ({known})", "train.lpips_weights", None, keep, required=True,
                                    fresh_only=False, known=known))
        return needs

    def _codebook_checked(self, need: WeightNeed) -> WeightNeed:
        """``need`` (the generator's weights) refusing a file that leaves a frozen codebook (``fix_codebook``, stage 2)
        at its random start: a partial load (strict_load_g: false) skips a codebook of another shape."""
        codebook = self.nets["net_g"].quantize.embedding.weight
        if codebook.requires_grad:
            return need

        def apply(sd: Mapping[str, torch.Tensor], load: Any) -> None:
            before = codebook.detach().clone()
            need.apply(sd, load)
            if torch.equal(before, codebook.detach()):
                theirs = next((tuple(v.shape) for k, v in sd.items() if k.endswith("quantize.embedding.weight")),
                              None)
                raise OptionError(f"{need.option}: {need.path} gives no codebook of network_g's shape "
                                  f"{tuple(codebook.shape)} (n_embed x embed_dim; the file: "
                                  f"{theirs if theirs else 'none'}) and fix_codebook keeps it frozen, so it would "
                                  "stay random; set network_g.n_embed / embed_dim to the HQ dictionary's, or "
                                  "network_g.fix_codebook: false")

        return replace(need, apply=apply, unset=(
            "net_g: its codebook starts random and stays frozen (network_g.fix_codebook, path.pretrain_network_g not "
            "set): the authors start stage 2 from the HQ dictionary's weights (a VQVAEGAN run's net_g)"))

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        super(SRGANModel, self).setup()  # the generator, its EMA and optimizer; the rest is the authors'
        if not self.is_train:
            return
        train = self.opt["train"]
        self.image_key = str(train["image_key"])
        if train["disc_start"] is None:
            raise OptionError("train.disc_start: RestoreFormerModel needs the iteration its discriminator starts "
                              "at (the authors' files: 30001 for the HQ dictionary, 10001 for RestoreFormer)")
        self.disc_start = int(train["disc_start"])
        total = train.get("total_iter")
        if isinstance(total, int) and self.disc_start >= total:
            logging.getLogger("anysr").warning(
                "train.disc_start %d is not below train.total_iter %d: the discriminators and the identity loss never "
                "train in this run (fine for a short trial; else lower disc_start or raise total_iter)",
                self.disc_start, total)
        self.codebook_weight = float(train["codebook_weight"])
        self.pixel_weight = float(train["pixelloss_weight"])
        self.perceptual_weight = float(train["perceptual_weight"])
        self.lpips_style_weight = float(train["lpips_style_weight"])
        self.disc_factor = float(train["disc_factor"])
        self.disc_weight = float(train["disc_weight"])
        self.d_loss = D_LOSSES[str(train["disc_loss"])]
        self.comp_weight = float(train["comp_weight"])
        self.comp_style_weight = float(train["comp_style_weight"])
        self.identity_weight = float(train["identity_weight"])
        self._check_face_options(train)
        # the authors' generator optimizer: the decoder's attention at special_params_lr_scale x the lr
        opt_g = plain_options(train["optim_g"])
        scale = float(train["special_params_lr_scale"])
        if not opt_g.get("param_groups"):
            opt_g["param_groups"] = [{"params": [SPECIAL_PARAMS], "lr": float(opt_g["lr"]) * scale}]
        del self.optimizers["net_g"], self.schedulers["net_g"]
        self.add_optimizer("net_g", self.nets["net_g"], opt_g, "train.optim_g")
        net_d = self.acc.prepare_model(self.nets["net_d"])
        self.nets["net_d"] = net_d
        net_d.train()
        if not train["optim_d"]:
            raise OptionError("train.optim_d: the discriminator optimizer is missing; add the authors' "
                              "{type: Adam, lr: <optim_g's lr>, betas: [0.5, 0.9]}")
        self.add_optimizer("net_d", net_d, train["optim_d"], "train.optim_d")
        self.grad_clip_norm_d = train.get("grad_clip_norm_d")
        self.net_d_iters, self.net_d_init_iters = 1, 0
        self.l1 = build_loss({"type": "L1Loss"}, "train").to(self.acc.device)
        comp: dict[str, Any] = {}
        if self.use_components:
            self.cri_component = build_loss({"type": "GANLoss", "gan_type": str(train["comp_disc_loss"]),
                                             "loss_weight": self.comp_weight}, "train.comp_disc_loss").to(
                self.acc.device)
            lr_scale = float(train["comp_params_lr_scale"])
            if train["optim_component"]:
                if lr_scale != 1:
                    raise OptionError("train.comp_params_lr_scale: sets the lr of the default optim_component; with "
                                      "train.optim_component given, set its lr and remove comp_params_lr_scale")
                comp = _with_default_betas(train["optim_component"], (0.9, 0.99), "train.optim_component")
            else:
                comp = {"type": "Adam", "lr": float(opt_g["lr"]) * lr_scale, "betas": [0.9, 0.99]}
        self.setup_face_networks(comp, "train.optim_component")
        self.lpips: LPIPS | None = None
        if self.perceptual_weight > 0:
            self.lpips = LPIPS(net="vgg").load_weights(*self.lpips_state_dicts).to(self.acc.device).eval()
            self.lpips_state_dicts.clear()

    def _check_face_options(self, train: Mapping[str, Any]) -> None:
        """The authors build the component discriminators when ``comp_weight`` > 0 and ArcFace when
        ``identity_weight`` > 0: here the networks and the weights go together, one line each."""
        if self.use_components != (self.comp_weight > 0):
            raise OptionError("train.comp_weight: the facial component discriminators (network_d_left_eye, ...) "
                              "train with comp_weight > 0 (the authors: 1.5 / 1.0); set both or neither")
        if self.comp_style_weight > 0 and not self.use_components:
            raise OptionError("train.comp_style_weight: the component style loss needs the facial component "
                              "discriminators and comp_weight > 0; add them or set it to 0")
        if (self.identity is not None) != (self.identity_weight > 0):
            raise OptionError("train.identity_weight: the identity loss needs network_identity (ResNetArcFace) and "
                              "identity_weight > 0; set both or neither")

    def loss_names(self) -> list[str]:
        """Every logged key (the authors' names), the same each iteration."""
        names = [*G_LOGS]
        if self.use_components:
            names += [f"g_{PART_LOG[p]}_loss" for p in PARTS]
            names += ["comp_style_loss"] if self.comp_style_weight > 0 else []
        names += ["identity_loss"] if self.identity is not None else []
        names += ["total_loss", *D_LOGS]
        names += [f"d_{PART_LOG[p]}_loss" for p in PARTS] if self.use_components else []
        return names

    # ---------------------------------------------------------------- the pieces
    def last_layer(self) -> torch.Tensor:
        """The weight the adaptive GAN weight compares gradients at (the authors' ``get_last_layer``)."""
        net = self.bare("net_g")
        return net.quant_conv.weight if not net.decoder.conv_out.weight.requires_grad else \
            net.decoder.conv_out.weight

    def adaptive_weight(self, nll: torch.Tensor, g_loss: torch.Tensor) -> torch.Tensor:
        """VQGAN's adaptive weight of the GAN loss, on the device (no host sync): the norms of the two losses'
        gradients at the last layer (averaged over the ranks first: the whole batch's, not each GPU's)."""
        last = self.last_layer()
        nll_grads = torch.autograd.grad(nll, last, retain_graph=True)[0]
        g_grads = torch.autograd.grad(g_loss, last, retain_graph=True)[0]
        if self.acc.world_size > 1:
            nll_grads = self.acc.strategy.all_reduce(nll_grads, "mean")
            g_grads = self.acc.strategy.all_reduce(g_grads, "mean")
        weight = torch.linalg.vector_norm(nll_grads) / (torch.linalg.vector_norm(g_grads) + 1e-4)
        return weight.clamp(0.0, 1e4).detach() * self.disc_weight

    def _generate(self, batch: Mapping[str, Any], with_loss: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The generator's output on the batch's ``image_key`` (signed, float32) and, with ``with_loss``, the
        quantiser's loss."""
        x = batch[self.image_key]
        with self.acc.precision.autocast():
            out = self.nets["net_g"](x, return_loss=True) if with_loss else self.forward_g(x)
        image, qloss = out if isinstance(out, tuple) else (out, None)
        return image.float() * 2 - 1, None if qloss is None else qloss.float()

    def _check_batch(self, batch: Mapping[str, Any]) -> None:
        if self.image_key not in batch:
            raise DataError(f"RestoreFormerModel: train.image_key is {self.image_key!r} but the batches hold "
                            f"{', '.join(sorted(k for k in batch if isinstance(batch[k], torch.Tensor)))}; use a "
                            "dataset that gives it (lq: FFHQDegradationDataset) or set image_key: gt")
        self.out_size = int(batch["gt"].shape[-1])
        ratio = self.out_size / 512  # the authors' face_ratio: crop sides int(80 r), int(120 r), crops times r
        self.eye_size, self.mouth_size = max(1, int(EYE_SIZE * ratio)), max(1, int(MOUTH_SIZE * ratio))
        self.face_factor = ratio
        if self.use_components:
            self.check_face({"lq": batch[self.image_key], **batch}, "FFHQDegradationDataset",
                            "the dataset's out_size")

    def _generator_losses(self, batch: Mapping[str, Any], gt: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        """The authors' optimizer-0 loss of one micro-batch: ``total_loss`` and the logged terms."""
        xrec, qloss = self._generate(batch, with_loss=True)
        assert qloss is not None
        log: dict[str, torch.Tensor] = {}
        rec = (gt - xrec).abs().mean() * self.pixel_weight
        zero = xrec.new_zeros(())
        p_loss, p_style = zero, zero
        if self.lpips is not None:
            with self.acc.precision.autocast():
                dist, style = lpips_with_style(self.lpips, gt, xrec)
            p_loss = dist.float().mean()
            p_style = style.float() * self.lpips_style_weight
            rec = rec + self.perceptual_weight * p_loss
        nll = rec
        with self.acc.precision.autocast():
            logits_fake = self.bare("net_d")(xrec)
        g_loss = -logits_fake.float().mean()
        d_weight = self.adaptive_weight(nll, g_loss)
        disc_factor = self.disc_factor if step >= self.disc_start else 0.0
        loss = nll + d_weight * disc_factor * g_loss + self.codebook_weight * qloss + p_style
        log.update(quant_loss=qloss, nll_loss=nll, rec_loss=rec, p_loss=p_loss, p_style_loss=p_style,
                   d_weight=d_weight, disc_factor=zero + disc_factor, g_loss=g_loss)
        late = step > self.disc_start  # the authors' strict comparison for the component and identity terms
        if self.use_components:
            parts, real = self._components(xrec, batch), self._components(gt, batch)
            style_total = zero
            for p in PARTS:
                d = self.bare(f"net_d_{p}")
                with self.acc.precision.autocast():
                    pred, feats = d(parts[p], return_feats=True)
                term = self.cri_component(pred.float(), True, is_disc=False)
                if self.comp_style_weight > 0:
                    with torch.no_grad(), self.acc.precision.autocast():
                        _, real_feats = d(real[p], return_feats=True)
                    style_total = style_total + self.comp_style_weight * (
                        self.l1(gram_matrix(feats[0].float()), gram_matrix(real_feats[0].float())) * 0.5
                        + self.l1(gram_matrix(feats[1].float()), gram_matrix(real_feats[1].float())))
                log[f"g_{PART_LOG[p]}_loss"] = term if late else zero
                loss = loss + term if late else loss
            if self.comp_style_weight > 0:
                log["comp_style_loss"] = style_total if late else zero
                loss = loss + style_total if late else loss
        if self.identity is not None:
            identity = self.identity_loss(xrec, gt, self.l1, self.identity_weight) if late else zero
            log["identity_loss"] = identity
            loss = loss + identity
        log["total_loss"] = loss
        return log

    # ---------------------------------------------------------------- the step
    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The authors' optimizers in turn: the generator, the discriminator on the updated generator's output,
        then (from ``disc_start``) the three component discriminators."""
        n = len(batches)
        step = self.current_iter - 1  # the authors' global_step
        net_g, net_d = self.nets["net_g"], self.nets["net_d"]
        parts_on = self.use_components and step >= self.disc_start
        discriminators = ["net_d", *(f"net_d_{p}" for p in PARTS if self.use_components)]
        totals: dict[str, torch.Tensor] = {}

        def add(values: Mapping[str, torch.Tensor]) -> None:
            for name, value in values.items():
                part = value.detach().float() / n
                totals[name] = totals[name] + part if name in totals else part

        for batch in batches:
            self._check_batch(batch)
        gts = [batch["gt"] * 2 - 1 for batch in batches]
        for name in discriminators:
            _set_requires_grad(self.bare(name), False)
        opt_g = self.optimizers["net_g"]
        opt_g.zero_grad(set_to_none=True)
        for k, (batch, gt) in enumerate(zip(batches, gts)):
            with contextlib.nullcontext() if k == n - 1 else self.acc.strategy.no_sync(net_g):
                log = self._generator_losses(batch, gt, step)
                self.acc.precision.backward(log["total_loss"] / n)
            add(log)
        self.acc.optimizer_step(opt_g, self.grad_clip_norm)
        self.update_emas()

        # the discriminators judge the updated generator's output (Lightning runs the step again per optimizer)
        with torch.no_grad():
            outputs = [self._generate(batch, with_loss=False)[0] for batch in batches]
        for name in discriminators:
            _set_requires_grad(self.bare(name), True)
        factor = self.disc_factor if step >= self.disc_start else 0.0
        opt_d = self.optimizers["net_d"]
        opt_d.zero_grad(set_to_none=True)
        for k, (xrec, gt) in enumerate(zip(outputs, gts)):
            with self.acc.strategy.no_sync(net_d):
                with self.acc.precision.autocast():
                    real = net_d(gt).float()
                l_real = factor * self.d_loss[0](real)
                self.acc.precision.backward(l_real / n)
            with contextlib.nullcontext() if k == n - 1 else self.acc.strategy.no_sync(net_d):
                with self.acc.precision.autocast():
                    fake = net_d(xrec).float()
                l_fake = factor * self.d_loss[1](fake)
                self.acc.precision.backward(l_fake / n)
            add({"disc_loss": l_real + l_fake, "logits_real": real.mean(), "logits_fake": fake.mean()})
        self.acc.optimizer_step(opt_d, self.grad_clip_norm_d)

        if self.use_components:
            zero = torch.zeros((), device=self.acc.device)
            crops = [{**self._components(xrec, batch), **{f"real_{p}": v for p, v in
                                                           self._components(gt, batch).items()}}
                     for xrec, gt, batch in zip(outputs, gts, batches)] if parts_on else []
            for p in PARTS:
                name = f"net_d_{p}"
                if not parts_on:
                    totals[f"d_{PART_LOG[p]}_loss"] = zero
                    continue
                net = self.nets[name]
                self.optimizers[name].zero_grad(set_to_none=True)
                for k, comp in enumerate(crops):
                    with self.acc.strategy.no_sync(net):
                        with self.acc.precision.autocast():
                            fake_pred, _ = net(comp[p])
                        l_fake = self.cri_component(fake_pred.float(), False, is_disc=True)
                        self.acc.precision.backward(l_fake / n)
                    with contextlib.nullcontext() if k == n - 1 else self.acc.strategy.no_sync(net):
                        with self.acc.precision.autocast():
                            real_pred, _ = net(comp[f"real_{p}"])
                        l_real = self.cri_component(real_pred.float(), True, is_disc=True)
                        self.acc.precision.backward(l_real / n)
                    add({f"d_{PART_LOG[p]}_loss": l_real + l_fake})
                self.acc.optimizer_step(self.optimizers[name])
        return totals


__all__ = ["RestoreFormerModel", "hinge_d_loss", "taming_init", "vanilla_d_loss"]
