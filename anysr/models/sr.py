"""SRModel: a generator trained with pixel losses (BasicSR's SRModel)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anysr.accelerators import Accelerator
from anysr.accelerators.base import device_scalar
from anysr.archs import build_network
from anysr.archs.arch_util import unit_range
from anysr.archs.kinds import arch_kind
from anysr.data.batch_augment import MIXING, BatchAugment
from anysr.errors import OptionError
from anysr.losses.downscaled import bicubic_shrink
from anysr.models.base import BaseModel, WeightNeed
from anysr.models.loss_set import (
    DISCRIMINATOR_ROLES,
    LossSpec,
    StateDicts,
    build_losses,
    loss_specs,
    loss_weight_needs,
)
from anysr.models.sam import FriendlySAM
from anysr.ops.augment import bicubic_resize
from anysr.registry import MODEL_REGISTRY

LOW_CLAMP = 1 / 255  # neosr's lower bound of a clamped output and of the upscaled LQ (train.clamp, match_lq_colors)


def upscale_lq(lq: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``lq`` upscaled to ``height`` x ``width`` as ``F.interpolate(mode='bicubic', antialias=True)`` (Keys' cubic
    with a = -0.5, not plain bicubic's -0.75) done as two small matrix products (no XLA fallback), in float32,
    clamped to [1/255, 1]: what ``train.match_lq_colors`` losses compare with (neosr's ``lq_interp``)."""
    return bicubic_resize(lq.detach(), height, width).clamp(LOW_CLAMP, 1)


def eco_weight(current_iter: int, eco_iters: int, schedule: str) -> float:
    """ECO's weight of the real pair at ``current_iter`` (neosr's ``eco_strategy``): ``sigmoid``, a logistic curve
    with slope 10 centred at a quarter of ``eco_iters``; ``linear``, ``min(current_iter / eco_iters, 1)``."""
    if schedule == "sigmoid":
        return 1 / (1 + math.exp(-1 * (10 * (current_iter / eco_iters - 0.25))))
    return min(current_iter / eco_iters, 1.0)


@MODEL_REGISTRY.register()
class SRModel(BaseModel):
    """``network_g`` trained with ``train.pixel_opt`` (L1 / MSE / Charbonnier), with optional EMA."""

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.nets["net_g"] = unit_range(build_network(self.generator_options()))
        self._check_network_kind()
        if self.is_train:
            self._check_step_options(self.opt["train"])
        if self.is_train and self.opt["train"]["perceptual_opt"] and not type(self).uses_perceptual:
            raise OptionError(f"train.perceptual_opt: model_type {type(self).__name__} trains with pixel losses "
                              "only; use model_type: SRGANModel or ESRGANModel, or remove it")
        self.loss_specs: list[LossSpec] = loss_specs(self.opt["train"], type(self).__name__, type(self).loss_roles) \
            if self.is_train else []
        self.loss_state_dicts: dict[str, StateDicts] = {}  # weight files of the losses, handed over by the engine
        self.current_iter = 0
        self.fsam: FriendlySAM | None = None  # train.sam (built in setup)
        self.sam_init = -1
        self.batch_augment = self._batch_augment() if self.is_train and self.opt["train"]["use_moa"] else None
        self.trained_pair: tuple[torch.Tensor, torch.Tensor] | None = None  # the last micro-batch trained on
        self.clamp_output = bool(self.is_train and self.opt["train"].get("clamp"))
        train = self.opt["train"] if self.is_train else {}
        # ECO (train.eco_enabled): its first and last iterations and schedule; from the start when fine-tuning
        self.eco = (0 if self.opt["path"]["pretrain_network_g"] else int(train["eco_init"]), int(train["eco_iters"]),
                    str(train["eco_schedule"])) if train.get("eco_enabled") else None

    fsam_steps = True  # train.sam: declared by each class that runs FSAM itself (a subclass does not inherit it)
    uses_perceptual = False  # whether train.perceptual_opt is used (GAN models); a pixel model refuses it
    image_batches = True  # whether batches are (B, C, H, W) images (train.use_moa); video models: clips
    takes_clips = False  # whether net_g may be a video network (clips in): the video models

    def _check_network_kind(self) -> None:
        """Refuse a video network (clips in) in a model of images (``network_g.type: auto`` reading a video file's
        weights, or a copied option file): its first forward would fail deep in the network."""
        net = self.nets["net_g"]
        kind = arch_kind(net)
        if kind != "image" and not type(self).takes_clips:
            raise OptionError(f"network_g.type: {type(net).__name__} is a video network (clips of frames in), but "
                              f"model_type {type(self).__name__} runs image networks; set model_type: "
                              f"{'VideoRecurrentModel' if kind == 'recurrent' else 'VideoBaseModel'} with a video "
                              "dataset, or give an image network's weights")

    wavelet_discriminator = False  # whether train.wavelet_guided applies (GAN models whose discriminator sees images)
    loss_roles: tuple[str, ...] = ("pixel", "learned", "artifact")  # loss roles it trains with (options read it)
    loss_prefix = "l_"  # losses are logged as <prefix><name>: l_pix (BasicSR's SRModel)

    def weight_needs(self) -> list[WeightNeed]:
        return super().weight_needs() + loss_weight_needs(self.loss_specs, self.loss_state_dicts)

    def _check_step_options(self, train: dict[str, Any]) -> None:
        """neosr's step options (train.clamp, match_lq_colors, eco_enabled, wavelet_guided): only where the model
        honours them."""
        name = type(self).__name__
        plain = type(self).image_batches and not getattr(type(self), "signed_images", False)
        for key in ("clamp", "match_lq_colors", "eco_enabled"):
            if train.get(key) and not plain:
                raise OptionError(f"train.{key}: {name} does not train on [0, 1] image batches; set it to false")
        if train.get("wavelet_guided") and not (type(self).wavelet_discriminator and plain):
            raise OptionError(f"train.wavelet_guided: {name} has no discriminator that judges images; use SRGANModel, "
                              "ESRGANModel or RealESRGANModel, or set it to false")

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
        if self.eco is not None and self.eco[0] <= self.current_iter <= self.eco[1]:
            batches = [self.eco_batch(b, eco_weight(self.current_iter, self.eco[1], self.eco[2]), gt_keys)
                       for b in batches]
        if batches and "lq" in batches[-1] and "gt" in batches[-1]:
            self.trained_pair = (batches[-1]["lq"], batches[-1]["gt"])
        return batches

    def eco_batch(self, batch: dict[str, Any], weight: float, gt_keys: Sequence[str]) -> dict[str, Any]:
        """ECO (Empirical Centroid-oriented Optimization, neosr's ``eco_strategy``): the generator's output ``sr`` on
        the LQ (no gradient) pulls the pair towards itself: GT ``(1 - w) sr + w gt`` (clamped to [1/255, 1] with
        ``train.clamp``), LQ ``(1 - w) shrink(sr) + w lq`` (antialiased bicubic, clamped to [0, 1]); ``w`` grows with
        the schedule, so the pairs move from the network's own towards the real ones."""
        lq = batch["lq"]
        with torch.no_grad():
            with self.acc.precision.autocast():
                sr = self.forward_g(lq)
            sr = sr.float()
            w = device_scalar(weight, torch.float32, sr.device)  # device data: one graph for every weight
            out = dict(batch)
            for key in gt_keys:
                if key in batch:
                    gt = (1 - w) * sr + w * batch[key].float()
                    out[key] = gt.clamp(LOW_CLAMP, 1) if self.clamp_output else gt
            scale = sr.shape[-1] // lq.shape[-1]
            out["lq"] = ((1 - w) * bicubic_shrink(sr, scale).clamp(0, 1) + w * lq.float()).to(lq.dtype)
        return out

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
        self.fsam = self._fsam(train)
        self.forward_g = self.acc.compile_model(net)

    def _fsam(self, train: dict[str, Any]) -> FriendlySAM | None:
        """``train.sam: fsam``: the generator's FSAM state (neosr's constants), checked against the model, the
        accumulation and the precision; None without it."""
        if not train.get("sam"):
            return None
        name = type(self).__name__
        if not vars(type(self)).get("fsam_steps", False):
            raise OptionError(f"train.sam: {name} does not run sharpness-aware steps; use SRModel, SRGANModel, "
                              "ESRGANModel, RealESRNetModel or RealESRGANModel, or remove it")
        if int(train.get("accumulate") or 1) > 1:
            raise OptionError("train.sam: FSAM does not work with train.accumulate > 1 (neosr's rule); set it to 1")
        if self.acc.precision.scaler is not None:
            raise OptionError("train.sam: FSAM does not work with fp16's loss scaler; use train.precision bf16 or fp32")
        self.sam_init = int(train["sam_init"])
        return FriendlySAM([p for g in self.optimizers["net_g"].param_groups for p in g["params"]])

    def sam_active(self) -> bool:
        """Whether this iteration's generator step is FSAM's (``train.sam``, from ``train.sam_init`` on); neosr clips
        no gradient then (the discriminator's neither)."""
        return self.fsam is not None and self.current_iter >= self.sam_init

    def generator_step(self, opt: torch.optim.Optimizer, backward: Callable[[], object]) -> None:
        """Step the generator's optimiser on the gradients in place; with ``train.sam`` from ``train.sam_init`` on,
        FSAM first: perturb the weights, ``backward()`` again there, restore them, step (no gradient clipping)."""
        if not self.sam_active():
            self.acc.optimizer_step(opt, self.grad_clip_norm)
            return
        self.acc.strategy.reduce_gradients(opt)
        self.fsam.perturb()
        opt.zero_grad(set_to_none=True)
        backward()
        self.fsam.restore()
        self.acc.optimizer_step(opt)

    def ema_output(self, lq: torch.Tensor) -> torch.Tensor:
        """The EMA generator's output (no gradient), what LDL compares with."""
        with torch.no_grad(), self.acc.precision.autocast():
            return self.emas["net_g"].module(lq).float()

    def training_output(self, output: torch.Tensor) -> torch.Tensor:
        """The generator's output as the losses and the discriminator see it: float32, clamped to [1/255, 1] with
        ``train.clamp`` (neosr's; no gradient where it clamps)."""
        output = output.float()
        return output.clamp(LOW_CLAMP, 1) if self.clamp_output else output

    def loss_terms(self, output: torch.Tensor, lq: torch.Tensor,
                   target: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every built loss but those on the discriminator's outputs, as ``{<loss_prefix><name>: value}`` in the
        options' order; ``target(role)`` is the GT a loss of that role compares with, or for a loss whose spec's
        target is ``lq`` (``train.match_lq_colors``) the upscaled LQ (:func:`upscale_lq`, computed once)."""
        out: dict[str, torch.Tensor] = {}
        ema_out = None
        lq_up: list[torch.Tensor] = []
        p = self.loss_prefix

        def compare_with(spec: LossSpec) -> torch.Tensor:
            if spec.target != "lq":
                return target(spec.role)
            if not lq_up:
                lq_up.append(upscale_lq(lq, *output.shape[-2:]))
            return lq_up[0]

        for spec in self.loss_specs:
            if spec.role in DISCRIMINATOR_ROLES:
                continue
            loss = self.losses[spec.name]
            if hasattr(loss, "at_iteration"):  # a loss drawing random numbers (MSSWDLoss): keyed by seed, iteration
                loss.at_iteration(self.current_iter, int(self.opt.get("manual_seed") or 0))
            if spec.role == "perceptual":
                percep, style = loss(output, compare_with(spec))
                if percep is not None:
                    out[p + spec.name] = percep
                if style is not None:
                    out[p + spec.style_name] = style
            elif spec.role == "artifact":
                ema_out = self.ema_output(lq) if ema_out is None else ema_out
                out[p + spec.name] = loss(output, ema_out, compare_with(spec))
            else:
                out[p + spec.name] = loss(output, compare_with(spec))
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
        def forward(lq: torch.Tensor) -> torch.Tensor:
            with self.acc.precision.autocast():
                return self.forward_g(lq)

        return self.step_losses(forward, batch)

    def step_losses(self, forward: Callable[[torch.Tensor], torch.Tensor],
                    batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The losses of one micro-batch with the generator given as ``forward`` (a compiled step passes its own,
        over its copy of the weights)."""
        output = self.training_output(forward(batch["lq"]))
        return self.loss_terms(output, batch["lq"], lambda role: batch["gt"])

    def jit_step_blockers(self) -> list[str]:
        """What this run trains that a compiled whole step (``accelerator.run_train_step``) does not carry yet; empty
        when it carries all: SRModel and its aliases, pixel losses, Adam / AdamW, EMA, clipping, accumulation."""
        name, train = type(self).__name__, self.opt["train"]
        out = []
        if type(self).train_step is not SRModel.train_step or type(self).compute_losses is not SRModel.compute_losses:
            out.append(f"model_type {name} steps its own way (only SRModel-like pixel training is jitted)")
        out += [f"train.{key} is not carried by the jitted step" for key in ("use_moa", "sam", "eco_enabled")
                if train.get(key)]
        out += [f"{s.key_path}: only pixel losses are in the jitted step so far (not {s.role})"
                for s in self.loss_specs if s.role != "pixel"]
        out += [f"{s.key_path}: a loss drawing random numbers per iteration is not in the jitted step"
                for s in self.loss_specs if hasattr(self.losses.get(s.name), "at_iteration")]
        ema = self.emas.get("net_g")
        if ema is not None and ema.switch_every:
            out.append("train.ema_switch_iter is not carried by the jitted step")
        return out

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """One optimiser step over ``len(batches)`` accumulated micro-batches; losses stay on the device."""
        batches = self.augment_batches(batches)
        done = self.acc.run_train_step(self, batches)
        if done is not None:
            return done
        net = self.nets["net_g"]
        opt = self.optimizers["net_g"]
        opt.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        n = len(batches)

        def backward(log: bool = True) -> None:
            for k, batch in enumerate(batches):
                ctx = self.acc.strategy.no_sync(net) if k < n - 1 else contextlib.nullcontext()
                with ctx:
                    losses = self.compute_losses(batch)
                    total = sum(losses.values())
                    self.acc.precision.backward(total / n)  # type: ignore[arg-type]
                for name, value in losses.items() if log else ():
                    part = value.detach() / n
                    totals[name] = totals[name] + part if name in totals else part

        backward()
        self.generator_step(opt, lambda: backward(False))
        self.update_emas()
        return totals


@MODEL_REGISTRY.register()
class SwinIRModel(SRModel):
    """BasicSR's name for SwinIR training; here the arch pads to its window itself, so it is SRModel."""

    fsam_steps = True


@MODEL_REGISTRY.register()
class HATModel(SRModel):
    """The HAT authors' model type (XPixelGroup/HAT): SRModel whose test pads inputs to a multiple of the window
    and tiles them by the top-level ``tile`` option. Here HAT pads itself and ``tile`` sets ``val.tile``."""

    fsam_steps = True


@MODEL_REGISTRY.register()
class DATModel(SRModel):
    """The DAT authors' model type (zhengchen1999/DAT): SRModel with an optional split test (``val.use_chop``,
    accepted); ``val.tile`` tiles instead."""

    fsam_steps = True


@MODEL_REGISTRY.register()
class DRCTModel(SRModel):
    """The DRCT authors' model type (ming053l/DRCT): HATModel's padding and tiling, as SRModel here."""

    fsam_steps = True
