"""GFPGANModel: GFPGAN's training (Wang et al., CVPR 2021; TencentARC/GFPGAN's ``GFPGANModel``), with the facial
component discriminators and the identity loss.

Per iteration, as the authors' model: the generator step (every ``net_d_iters`` iterations after
``net_d_init_iters``): ``pixel_opt``, the image pyramid loss (``L1_opt`` between the U-Net's RGB image at each level
and the bilinearly halved GT, times ``pyramid_loss_weight``; after ``remove_pyramid_loss`` iterations times 1e-12,
so every parameter keeps a gradient as DDP wants), ``perceptual_opt`` (its style term too), ``gan_opt`` on
``network_d`` (StyleGAN2's discriminator, ``wgan_softplus``), and with ``network_d_left_eye`` / ``_right_eye`` /
``_mouth`` the ``gan_component_opt`` loss of each facial component (cut from the output by RoIAlign at the
dataset's ``loc_*`` boxes: 80 x 80 eyes, 120 x 120 mouth at 512 pixels) plus the Gram-matrix style loss of their
features (``comp_style_weight``), and with ``network_identity`` (ArcFace) the L1 distance of the identity
features of the gray 128 x 128 output and GT (``identity_weight``). Then the EMA generator (decay
``0.5 ** (32 / 10000)`` unless ``train.ema_decay`` is set), the discriminator (the GAN loss on fake and real, the
R1 penalty every ``net_d_reg_every`` iterations; its optimizer lazily regularised as StyleGAN2's) and the three
component discriminators (their real half by ``gan_component_opt``, their fake half by ``gan_opt``: the authors'
code, kept).

Images: anysr's pipeline gives [0, 1]; the losses are computed in the authors' [-1, 1] (GFPGAN's files normalise
with mean / std 0.5, which the options therefore accept and leave to this model), so their weights mean what they
mean in GFPGAN's files. Optimizers: ``optim_g`` with betas (0, 0.99) and ``optim_component`` with (0.9, 0.99)
unless given (the authors'). ``network_g.decoder_load_path`` (a StyleGAN2 generator's weights, ``params_ema``) is
read by the engine into the decoder when training starts from scratch; ``path.pretrain_network_identity``
(ArcFace's weights) is read on every start (it is not part of the training state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.resize_util import resize_bilinear
from anysr.data.ffhq_degradation_dataset import COMPONENTS
from anysr.errors import DataError, OptionError
from anysr.losses import build_loss, r1_penalty
from anysr.losses.perceptual import gram_matrix
from anysr.models.base import WeightNeed
from anysr.models.gan import SRGANModel, _set_requires_grad
from anysr.models.stylegan2 import BASICSR_EMA_DECAY, _lazy_regularised, check_discriminator_size
from anysr.ops.roi_align import roi_align, static_grid
from anysr.registry import MODEL_REGISTRY, OPTIMIZER_REGISTRY, constructor_args, plain_options

PARTS = COMPONENTS  # the facial components, in GFPGAN's order
EYE_SIZE, MOUTH_SIZE = 80, 120  # RoIAlign output sides at a 512-pixel face (the authors')
DECODER_PATH_ARGS = ("decoder_load_path",)  # network_g keys naming weight files the engine reads
PYRAMID_OFF_WEIGHT = 1e-12  # the authors' weight after remove_pyramid_loss: a gradient for every parameter (DDP)


def gray_for_identity(x: torch.Tensor, size: int = 128) -> torch.Tensor:
    """The authors' identity input: an RGB face's luma (0.2989, 0.5870, 0.1140), bilinearly resized to ``size``
    (their ``F.interpolate``; ``resize_bilinear``, whose gradient XLA lowers)."""
    luma = 0.2989 * x[:, 0:1] + 0.5870 * x[:, 1:2] + 0.1140 * x[:, 2:3]
    return resize_bilinear(luma, (size, size), align_corners=False)


def _with_default_betas(opt: Any, betas: tuple[float, float], key_path: str) -> dict[str, Any]:
    """The optimizer options with ``betas`` unless given, for an optimizer that takes them."""
    out = plain_options(opt)
    cls = OPTIMIZER_REGISTRY.get(str(out["type"]), f"{key_path}.type")
    if "betas" not in out and "betas" in constructor_args(cls)[0]:
        out["betas"] = list(betas)
    return out


def _into(module: Callable[[], nn.Module]) -> Callable[[Mapping[str, torch.Tensor], Any], None]:
    return lambda sd, load: load(module(), sd)


class FaceParts:
    """The facial-component discriminators (``network_d_left_eye`` / ``_right_eye`` / ``_mouth``), their RoIAligned
    crops and the identity network (``network_identity``, frozen) of a face model: GFPGAN's, shared by
    ``RestoreFormerModel``. The model sets ``out_size``, ``eye_size``, ``mouth_size`` and ``face_factor`` (the
    crops' sides and the factor the authors multiply them by) before cropping."""

    opt: dict[str, Any]
    nets: dict[str, nn.Module]
    is_train: bool
    acc: Accelerator
    out_size: int
    eye_size: int
    mouth_size: int
    face_factor: float
    bare: Callable[[str], nn.Module]
    add_optimizer: Callable[..., None]

    def build_face_networks(self) -> None:
        """Build the component discriminators (all three or none) and the identity network from the options."""
        opt = self.opt
        self.identity: nn.Module | None = None
        self.use_components = False
        if not self.is_train:
            return
        given = [p for p in PARTS if opt.get(f"network_d_{p}")]
        if given and len(given) < len(PARTS):
            missing = [f"network_d_{p}" for p in PARTS if p not in given]
            raise OptionError(f"{missing[0]}: the facial component discriminators come as three "
                              f"(network_d_left_eye, network_d_right_eye, network_d_mouth); add {', '.join(missing)} "
                              "or remove the others")
        self.use_components = bool(given)
        for p in given:
            self.nets[f"net_d_{p}"] = build_network(opt[f"network_d_{p}"], f"network_d_{p}")
        if opt.get("network_identity"):
            self.identity = build_network(opt["network_identity"], "network_identity").eval()
            self.identity.requires_grad_(False)

    def face_weight_needs(self) -> list[WeightNeed]:
        """The component discriminators' weights (fresh runs) and the identity network's (every start)."""
        if not self.is_train:
            return []
        paths = self.opt["path"]
        needs = []
        for p in PARTS if self.use_components else ():
            name = f"net_d_{p}"
            needs.append(WeightNeed(name, f"path.pretrain_network_d_{p}", paths[f"pretrain_network_d_{p}"],
                                    _into(lambda n=name: self.bare(n)), key_option=f"path.pretrain_network_d_{p}"))
        if self.identity is not None:
            identity = self.identity
            needs.append(WeightNeed(
                "network_identity", "path.pretrain_network_identity", paths["pretrain_network_identity"],
                lambda sd, load: load(identity, sd), param_key="auto", key_option="path.pretrain_network_identity",
                required=True, fresh_only=False,
                missing="the identity loss needs ArcFace's weights (GFPGAN's arcface_resnet18.pth)"))
        return needs

    def setup_face_networks(self, optim: dict[str, Any], key_path: str) -> None:
        """The component discriminators on the device, in training mode, each with an optimizer from ``optim``;
        the identity network on the device."""
        for p in PARTS if self.use_components else ():
            name = f"net_d_{p}"
            self.nets[name] = self.acc.prepare_model(self.nets[name])
            self.nets[name].train()
            self.add_optimizer(name, self.nets[name], optim, key_path)
        if self.identity is not None:
            self.identity = self.identity.to(self.acc.device).eval()

    def check_face(self, batch: Mapping[str, Any], dataset: str, size_key: str) -> None:
        """One-line DataErrors: faces of ``out_size``; the component boxes when the discriminators need them."""
        name = type(self).__name__
        h, w = batch["lq"].shape[-2:]
        if (h, w) != (self.out_size, self.out_size) or tuple(batch["gt"].shape[-2:]) != (h, w):
            raise DataError(f"{name} trains on {self.out_size}x{self.out_size} faces ({size_key}), got "
                            f"LQ {w}x{h} and GT {batch['gt'].shape[-1]}x{batch['gt'].shape[-2]}; set "
                            f"{size_key.split('.')[-1]} (and the dataset's out_size) to the faces' size")
        if self.use_components and "loc_left_eye" not in batch:
            raise DataError(f"{name}: the facial component discriminators need the face's eye and mouth boxes "
                            f"(loc_left_eye, loc_right_eye, loc_mouth); use {dataset} with "
                            "crop_components: true and its component_path, or remove network_d_left_eye / "
                            "network_d_right_eye / network_d_mouth")

    def _components(self, img: torch.Tensor, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The left eyes, right eyes and mouths of ``img`` (signed), RoIAligned at the batch's boxes, times
        ``face_factor``."""
        b = img.shape[0]
        index = torch.arange(b, device=img.device, dtype=torch.float32)[:, None]

        def boxes(part: str) -> torch.Tensor:
            return torch.cat([index, batch[f"loc_{part}"].to(img.device, torch.float32)], dim=1)

        eyes = torch.stack([boxes("left_eye"), boxes("right_eye")], dim=1).reshape(2 * b, 5)
        static = self.acc.static_shapes
        both = roi_align(img, eyes, self.eye_size, max_grid=static_grid(self.out_size, self.eye_size)
                         if static else None) * self.face_factor
        mouths = roi_align(img, boxes("mouth"), self.mouth_size,
                           max_grid=static_grid(self.out_size, self.mouth_size) if static else None) * self.face_factor
        return {"left_eye": both[0::2], "right_eye": both[1::2], "mouth": mouths}

    def identity_loss(self, output: torch.Tensor, gt: torch.Tensor, criterion: nn.Module,
                      weight: float) -> torch.Tensor:
        """The identity loss: ``criterion`` between ArcFace's features of the gray 128 x 128 output and GT (no
        gradient through the GT's), times ``weight``."""
        assert self.identity is not None
        autocast = self.acc.precision.autocast
        with autocast():
            with torch.no_grad():
                id_gt = self.identity(gray_for_identity(gt))
            id_out = self.identity(gray_for_identity(output))
        return criterion(id_out.float(), id_gt.float()) * weight


@MODEL_REGISTRY.register()
class GFPGANModel(FaceParts, SRGANModel):
    """GFPGAN (``GFPGANv1`` / ``GFPGANv1Clean``) against ``StyleGAN2Discriminator``, with optional facial-component
    discriminators (``FacialComponentDiscriminator``) and identity loss (``ResNetArcFace``); train keys as the
    authors' files: ``L1_opt``, ``pyramid_loss_weight``, ``remove_pyramid_loss``, ``gan_component_opt``,
    ``comp_style_weight``, ``identity_weight``, ``optim_component``, ``r1_reg_weight``, ``net_d_reg_every``."""

    loss_roles = ("pixel", "perceptual", "learned", "gan")
    default_scale = 1  # restores faces at their size: GFPGAN's files set no scale
    signed_images = True  # the authors' [-1, 1]: the options take mean / std 0.5 as this and leave it to the model
    weight_path_args = DECODER_PATH_ARGS
    extra_networks = (*(f"network_d_{p}" for p in PARTS), "network_identity")  # top-level keys it trains with

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        net_g = self.nets["net_g"]
        if not hasattr(net_g, "stylegan_decoder") or not hasattr(net_g, "out_size"):
            raise OptionError(f"network_g.type: GFPGANModel trains GFPGAN (GFPGANv1, GFPGANv1Clean), got "
                              f"{opt['network_g']['type']}")
        self.out_size = int(net_g.out_size)
        self.log_size = self.out_size.bit_length() - 1
        if "net_d" in self.nets:
            check_discriminator_size(self.nets["net_d"], self.out_size, "network_g.out_size")
        self.build_face_networks()

    # ---------------------------------------------------------------- the contract
    def generator_options(self) -> Any:
        net = plain_options(self.opt["network_g"])
        return {k: v for k, v in net.items() if k not in DECODER_PATH_ARGS}

    def weight_needs(self) -> list[WeightNeed]:
        """The StyleGAN2 decoder's weights (``network_g.decoder_load_path``, fresh runs) first, then the generator's
        and the discriminator's, the component discriminators', the identity network's and the losses'."""
        net_opt = self.opt["network_g"]
        needs = []
        decoder = net_opt["decoder_load_path"] if "decoder_load_path" in net_opt else None
        if decoder:
            needs.append(WeightNeed(
                "stylegan_decoder", "network_g.decoder_load_path", decoder,
                _into(lambda: self.nets["net_g"].stylegan_decoder), param_key="params_ema",
                key_option="network_g.decoder_load_path (a StyleGAN2 generator's weights with 'params_ema')"))
        elif self.is_train and not self.opt["path"]["pretrain_network_g"] and not any(
                p.requires_grad for p in self.nets["net_g"].stylegan_decoder.parameters()):
            needs.append(WeightNeed(
                "stylegan_decoder", "network_g.decoder_load_path", None, lambda sd, load: None, required=True,
                missing="fix_decoder keeps GFPGAN's StyleGAN2 decoder frozen, so with neither this nor "
                        "path.pretrain_network_g it would stay random; give a StyleGAN2 generator's weights (the "
                        "authors': StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth) or set network_g.fix_decoder: "
                        "false",
                stand_in=lambda: {}))
        return needs + super().weight_needs() + self.face_weight_needs()

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        super().setup()
        if not self.is_train:
            return
        train = self.opt["train"]
        if "net_g" not in self.emas:
            self.add_ema("net_g", BASICSR_EMA_DECAY, train)
        self.d_every = int(train["net_d_reg_every"])
        self.r1_weight = float(train["r1_reg_weight"])
        # the authors' optimizers: the generator's betas (0, 0.99) unless given, the discriminator's lazily
        # regularised (StyleGAN2's lr and betas correction); built again in place of SRGANModel's
        for name, key, opts in (
                ("net_g", "optim_g", _with_default_betas(train["optim_g"], (0.0, 0.99), "train.optim_g")),
                ("net_d", "optim_d", _lazy_regularised(train["optim_d"], self.d_every, "train.optim_d"))):
            del self.optimizers[name], self.schedulers[name]
            self.add_optimizer(name, self.nets[name], opts, f"train.{key}")
        self.cri_l1 = build_loss(plain_options(train["L1_opt"] or {"type": "L1Loss"}), "train.L1_opt").to(
            self.acc.device)
        self.pyramid_weight = float(train["pyramid_loss_weight"])
        self.remove_pyramid = train["remove_pyramid_loss"]
        self.comp_style_weight = float(train["comp_style_weight"])
        self.identity_weight = float(train["identity_weight"])
        ratio = self.out_size / 512
        self.eye_size = max(1, round(EYE_SIZE * ratio))
        self.mouth_size = max(1, round(MOUTH_SIZE * ratio))
        self.face_factor = float(int(ratio)) if ratio >= 1 else 1.0  # the authors' int(out_size / 512)
        if self.use_components:
            if not train["gan_component_opt"]:
                raise OptionError("train.gan_component_opt: the facial component discriminators need their GAN "
                                  "loss; add {type: GANLoss, gan_type: vanilla, loss_weight: 1}")
            if not train["optim_component"]:
                raise OptionError("train.optim_component: the facial component discriminators need an optimizer; "
                                  "add {type: Adam, lr: 2e-3}")
            self.cri_component = build_loss(plain_options(train["gan_component_opt"]),
                                            "train.gan_component_opt").to(self.acc.device)
        comp = _with_default_betas(train["optim_component"], (0.9, 0.99), "train.optim_component") \
            if self.use_components else {}
        self.setup_face_networks(comp, "train.optim_component")

    # ---------------------------------------------------------------- helpers
    def _sync(self, net: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Reduce gradients (DDP) only at the last backward of a step."""
        return contextlib.nullcontext() if last else self.acc.strategy.no_sync(net)

    def _check_face(self, batch: Mapping[str, Any]) -> None:
        self.check_face(batch, "FFHQDegradationDataset", "network_g.out_size")

    def _pyramid(self, gt: torch.Tensor) -> list[torch.Tensor]:
        """The GT at each U-Net level, 8 pixels up to the face's size (bilinear halving, as the authors)."""
        levels = [gt]
        for _ in range(self.log_size - 3):
            levels.insert(0, F.interpolate(levels[0], scale_factor=0.5, mode="bilinear", align_corners=False))
        return levels

    def _pyramid_weight(self) -> float:
        if self.pyramid_weight > 0 and self.remove_pyramid is not None and self.current_iter > self.remove_pyramid:
            return PYRAMID_OFF_WEIGHT
        return self.pyramid_weight

    def loss_names(self) -> list[str]:
        """Every generator loss key, the same each step (iterations without a generator step report zeros)."""
        names = super().loss_names()
        if self.pyramid_weight > 0:
            names += [f"l_p_{2 ** (i + 3)}" for i in range(self.log_size - 2)]
        names.append(self.gan_name)
        if self.use_components:
            names += [f"l_g_gan_{p}" for p in PARTS]
            names += ["l_g_comp_style_loss"] if self.comp_style_weight > 0 else []
        names += ["l_identity"] if self.identity is not None else []
        return names

    # ---------------------------------------------------------------- the step
    def _forward(self, batch: Mapping[str, Any], with_rgb: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The generator's output (signed) and, with ``with_rgb``, its U-Net RGB images (signed)."""
        with self.acc.precision.autocast():
            out = self.nets["net_g"](batch["lq"], return_rgb=with_rgb)
        image, rgbs = out if isinstance(out, tuple) else (out, [])
        return image.float() * 2 - 1, [r.float() for r in rgbs]

    def _generator_losses(self, batch: Mapping[str, Any], gt: torch.Tensor) -> tuple[torch.Tensor,
                                                                                    dict[str, torch.Tensor],
                                                                                    dict[str, torch.Tensor]]:
        """(signed output, losses, its facial components and the GT's: ``<part>``, ``real_<part>``) of one
        micro-batch."""
        pyr = self._pyramid_weight()
        output, rgbs = self._forward(batch, with_rgb=pyr > 0)
        losses = self.loss_terms(output, batch["lq"], lambda role: gt)
        if pyr > 0:
            for i, (rgb, ref) in enumerate(zip(rgbs, self._pyramid(gt))):
                losses[f"l_p_{2 ** (i + 3)}"] = self.cri_l1(rgb, ref) * pyr
        with self.acc.precision.autocast():
            fake = self.bare("net_d")(output)
        losses[self.gan_name] = self.cri_gan(fake.float(), True, is_disc=False)
        parts: dict[str, torch.Tensor] = {}
        if self.use_components:
            parts = self._components(output, batch)
            real_parts = self._components(gt, batch)
            style = []
            for p in PARTS:
                d = self.bare(f"net_d_{p}")
                with self.acc.precision.autocast():
                    pred, feats = d(parts[p], return_feats=True)
                losses[f"l_g_gan_{p}"] = self.cri_component(pred.float(), True, is_disc=False)
                if self.comp_style_weight > 0:
                    with torch.no_grad(), self.acc.precision.autocast():
                        _, real_feats = d(real_parts[p], return_feats=True)
                    style.append(self.cri_l1(gram_matrix(feats[0].float()), gram_matrix(real_feats[0].float())) * 0.5
                                 + self.cri_l1(gram_matrix(feats[1].float()), gram_matrix(real_feats[1].float())))
            if style:
                losses["l_g_comp_style_loss"] = sum(style) * self.comp_style_weight  # type: ignore[assignment]
            parts.update({f"real_{p}": v for p, v in real_parts.items()})
        if self.identity is not None:
            losses["l_identity"] = self.identity_loss(output, gt, self.cri_l1, self.identity_weight)
        return output, losses, parts

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Generator step (when due), EMA, discriminator step, component discriminator steps."""
        n = len(batches)
        it = self.current_iter
        net_g, net_d = self.nets["net_g"], self.nets["net_d"]
        opt_g, opt_d = self.optimizers["net_g"], self.optimizers["net_d"]
        step_g = it % self.net_d_iters == 0 and it > self.net_d_init_iters
        reg_d = it % self.d_every == 0
        discriminators = [self.bare("net_d")] + [self.bare(f"net_d_{p}") for p in PARTS if self.use_components]
        totals: dict[str, torch.Tensor] = {}
        zero = torch.zeros((), device=self.acc.device)

        def add(values: Mapping[str, torch.Tensor]) -> None:
            for name, value in values.items():
                part = value.detach().float() / n
                totals[name] = totals[name] + part if name in totals else part

        gts = []
        for batch in batches:
            self._check_face(batch)
            gts.append(batch["gt"] * 2 - 1)
        outputs: list[torch.Tensor] = []
        parts: list[dict[str, Any]] = []
        for d in discriminators:
            _set_requires_grad(d, False)
        if step_g:
            opt_g.zero_grad(set_to_none=True)
            for k, (batch, gt) in enumerate(zip(batches, gts)):
                with self._sync(net_g, k == n - 1):
                    output, losses, comp = self._generator_losses(batch, gt)
                    self.acc.precision.backward(sum(losses.values()) / n)  # type: ignore[arg-type]
                outputs.append(output.detach())
                parts.append({p: v.detach() for p, v in comp.items()} if comp else {})
                add(losses)
            self.acc.optimizer_step(opt_g, self.grad_clip_norm)
        else:
            with torch.no_grad():
                for batch, gt in zip(batches, gts):
                    output, _ = self._forward(batch, with_rgb=False)
                    outputs.append(output)
                    comp = self._components(output, batch) if self.use_components else {}
                    if comp:
                        comp.update({f"real_{p}": v for p, v in self._components(gt, batch).items()})
                    parts.append(comp)
            totals.update({name: zero for name in self.loss_names()})
        self.update_emas()

        for d in discriminators:
            _set_requires_grad(d, True)
        opt_d.zero_grad(set_to_none=True)
        for k, (output, gt) in enumerate(zip(outputs, gts)):
            last = k == n - 1
            with self.acc.strategy.no_sync(net_d):
                with self.acc.precision.autocast():
                    fake_pred = net_d(output).float()
                l_fake = self.cri_gan(fake_pred, False, is_disc=True)
                self.acc.precision.backward(l_fake / n)
            with self._sync(net_d, last and not reg_d):
                with self.acc.precision.autocast():
                    real_pred = net_d(gt).float()
                l_real = self.cri_gan(real_pred, True, is_disc=True)
                self.acc.precision.backward(l_real / n)
            add({"l_d": l_real + l_fake, "real_score": real_pred.mean(), "fake_score": fake_pred.mean()})
            if reg_d:
                with self._sync(net_d, last):
                    real = gt.detach().requires_grad_(True)
                    pred = net_d(real)  # fp32: a gradient penalty in low precision is noise
                    l_r1 = self.r1_weight / 2 * r1_penalty(pred, real) * self.d_every + 0 * pred[0].sum()
                    self.acc.precision.backward(l_r1 / n)
                add({"l_d_r1": l_r1})
            else:
                add({"l_d_r1": zero})
        self.acc.optimizer_step(opt_d, self.grad_clip_norm_d)

        if self.use_components:
            for p in PARTS:
                name = f"net_d_{p}"
                net = self.nets[name]
                self.optimizers[name].zero_grad(set_to_none=True)
                for k, comp in enumerate(parts):
                    with self.acc.strategy.no_sync(net):
                        with self.acc.precision.autocast():
                            fake_pred, _ = net(comp[p])
                        l_fake = self.cri_gan(fake_pred.float(), False, is_disc=True)  # the authors' gan_opt here
                        self.acc.precision.backward(l_fake / n)
                    with self._sync(net, k == n - 1):
                        with self.acc.precision.autocast():
                            real_pred, _ = net(comp[f"real_{p}"])
                        l_real = self.cri_component(real_pred.float(), True, is_disc=True)
                        self.acc.precision.backward(l_real / n)
                    add({f"l_d_{p}": l_real + l_fake})
            for p in PARTS:
                self.acc.optimizer_step(self.optimizers[f"net_d_{p}"])
        return totals

__all__ = ["FaceParts", "GFPGANModel", "gray_for_identity"]
