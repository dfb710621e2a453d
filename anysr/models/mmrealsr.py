"""MMRealSRNetModel and MMRealSRGANModel: MMRealSR trained as its authors do (Mou et al., "Metric Learning based
Interactive Modulation for Real-World Super-Resolution", ECCV 2022; their models' option keys).

Per micro-batch of a training step:

1. MMRealSR's anchored synthesis (:mod:`anysr.data.degradation.mmrealsr`, from ``MMRealSRGANDataset``'s seven
   kernels): three LQ versions of each GT (origin; more blur; more noise and compression) and two anchors (the
   clean downscaled GT and the most degraded version), on the device (``degrade_in: step``) or in the loader
   workers (``loader``, what ``auto`` picks on XLA);
2. the training-pair pool (``queue_size``) over all of them, as Real-ESRGAN's;
3. the network's anchored forward (``MMRealSR.forward(lq, anchor)``): all five images of each GT restored, the
   anchors steered with degrees 0 and 1; the image losses compare all five outputs with the GT;
4. the metric-learning losses on the estimated degrees: ``train.rank_opt_b`` (blur) and ``train.rank_opt``
   (noise) rank the more degraded version above the origin by a margin (``MarginRankingLoss``);
   ``train.rank_opt_anchor`` pulls the clean anchor's degrees to 0 and the most degraded one's to 1 (squared
   distances, weighted); the optional ``train.constraint_opt`` ties the degrees of versions that differ only in
   the other degradation. MMRealSRNetModel trains them; MMRealSRGANModel logs them only (its network,
   ``MMRRDBNet_decouple``, freezes the estimator), with pixel (``l1_gt_usm``), perceptual (``percep_gt_usm``) and
   GAN losses (``gan_gt_usm``) and the discriminator step of SRGANModel, which judges all five outputs.

The authors' quirks kept: the GAN stage's clean-anchor loss aims at -0.05 (``(d + 0.05)^2``), the Net stage's
at 0; the discriminator sees each GT five times (once per output). Validation and inference run the plain
network (``forward(lq)``: the estimated degrees steer it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from anysr.accelerators import Accelerator
from anysr.data.degradation.mmrealsr import (
    ANCHOR_KERNELS,
    AnchoredLoaderSynthesis,
    AnchoredSettings,
    synthesise_anchored,
)
from anysr.data.degradation.realesrgan import pool_rng, step_rng
from anysr.data.pair_pool import TrainingPairPool, wide_keys
from anysr.errors import DataError, OptionError
from anysr.losses import build_loss
from anysr.models.gan import SRGANModel
from anysr.models.realesrgan import _Synthesis
from anysr.models.sr import SRModel
from anysr.registry import ARCH_REGISTRY, MODEL_REGISTRY, argument

__all__ = ["MMRealSRGANModel", "MMRealSRNetModel"]

VERSIONS = 5  # per GT: three LQ versions and two anchors
_DEGREES = ("blur", "noise")  # the degradations the losses rank, in the network's degree order


class _Anchored(_Synthesis):
    """What both models share: the anchored synthesis and pool, the anchored forward, the degree losses."""

    anchored = True  # the options read this: MMRealSR's keys apply
    image_batches = False  # the batches hold five versions per GT: no batch augmentations, clamp, ECO
    anchor_shift = 0.0  # the clean anchor's loss is (d + shift)^2 (the authors' GAN stage: 0.05)
    train_degrees = True  # whether the degree losses are trained (else logged only)

    def _init_synthesis(self) -> None:
        super()._init_synthesis()
        opt = self.opt
        self.cri_rank = self.cri_rank_b = self.cri_constraint = None
        self.anchor_weight = 0.0
        if not self.is_train:
            return
        if not self.high_order:
            raise OptionError(f"high_order_degradation: {type(self).__name__} trains on the versions it synthesises "
                              "(MMRealSRGANDataset); set it to true")
        self.anchored_settings = AnchoredSettings.from_options(opt, anchor_usm=self.keep_sharpened)
        if self.pool is not None:
            self.pool = TrainingPairPool(int(opt["queue_size"]), {"lq": True, "anchor": True,
                                                                   "gt": not self.keep_sharpened})
        train = opt["train"]
        self.cri_rank = build_loss(train["rank_opt"], "train.rank_opt") if train.get("rank_opt") else None
        self.cri_rank_b = build_loss(train["rank_opt_b"], "train.rank_opt_b") if self.cri_rank is not None else None
        if self.cri_rank is not None:
            self.anchor_weight = float(train["rank_opt_anchor"]["loss_weight"])
        self.cri_constraint = build_loss(train["constraint_opt"], "train.constraint_opt") \
            if train.get("constraint_opt") else None
        degradations = int(argument(ARCH_REGISTRY.get(opt["network_g"]["type"]), opt["network_g"], "num_degradation"))
        if (self.cri_rank is not None or self.cri_constraint is not None) and degradations != len(_DEGREES):
            raise OptionError(f"network_g.num_degradation: MMRealSR's losses rank {' and '.join(_DEGREES)} degrees, "
                              f"so the network estimates {len(_DEGREES)}; got {degradations}")

    def _setup_synthesis(self) -> None:
        super()._setup_synthesis()
        for name in ("cri_rank", "cri_rank_b", "cri_constraint"):
            if getattr(self, name, None) is not None:
                setattr(self, name, getattr(self, name).to(self.acc.device))

    def prepare_train_set(self, dataset: Any) -> None:
        """With ``degrade_in: loader``, hand the anchored synthesis to the training set (MMRealSRGANDataset)."""
        if self.degrade_in != "loader":
            return
        attach = getattr(dataset, "attach_synthesis", None)
        if attach is None or not getattr(dataset, "anchored_kernels", False):
            raise OptionError(f"degrade_in: loader: {type(self).__name__} synthesises from MMRealSRGANDataset, got "
                              f"{type(dataset).__name__}")
        attach(AnchoredLoaderSynthesis(self.anchored_settings))

    # ---------------------------------------------------------------- synthesis, pool, targets
    def _synthesise_versions(self, batch: dict[str, Any], micro: int) -> dict[str, torch.Tensor]:
        missing = [k for k in ("gt", *ANCHOR_KERNELS, "seed") if k not in batch]
        if missing:
            raise DataError(f"{type(self).__name__} synthesises from an MMRealSRGANDataset batch (gt, its seven "
                            f"kernels, seed); this batch lacks {', '.join(missing)}")
        seeds = [int(s) for s in batch["seed"]]
        out = synthesise_anchored(batch["gt"], {k: batch[k] for k in ANCHOR_KERNELS}, settings=self.anchored_settings,
                                  rng=step_rng(int(self.opt["manual_seed"]), self.current_iter, micro), seeds=seeds,
                                  gens=self._generators(len(seeds)), usm=self.usm, jpeger=self.jpeger)
        return {k: out[k] for k in ("lq", "anchor", "gt")}

    def training_versions(self, batch: dict[str, Any], micro: int) -> dict[str, torch.Tensor]:
        """``lq`` (b, 3, c, h, w), ``anchor`` (b, 2, c, h, w) and ``gt`` (b, c, H, W) of micro-batch ``micro``:
        synthesised (unless the loader did), then through the pool."""
        with torch.no_grad():
            if "lq" in batch:  # synthesised in the loader workers
                if "anchor" not in batch:
                    raise DataError(f"{type(self).__name__} trains on MMRealSR's anchored versions; this batch has an "
                                    "LQ but no anchor (use MMRealSRGANDataset)")
                parts = {"lq": batch["lq"], "anchor": batch["anchor"], "gt": batch["gt"]}
            else:
                parts = self._synthesise_versions(batch, micro)
            if self.pool is not None:
                b = parts["lq"].shape[0]
                parts = self.pool.swap(parts, pool_rng(int(self.opt["manual_seed"]), self.current_iter, micro),
                                       offset=self.acc.rank * b, global_batch=self.acc.world_size * b,
                                       to_device=self.acc.to_device, wide=wide_keys(batch))
            if self.opt.get("high_order_degradations_debug"):  # the five versions of each GT, in a row
                self._debug_save(torch.cat([parts["lq"], parts["anchor"]], dim=1).flatten(0, 1), parts["gt"], micro)
        return {k: v.contiguous() for k, v in parts.items()}

    def _fed(self, batches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.anchored_targets(self.training_versions(batch, k)) for k, batch in enumerate(batches)]

    def anchored_targets(self, parts: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The batch the losses read: the versions, and the GT once per output (``gt``, b * 5 images)."""
        return {"lq": parts["lq"], "anchor": parts["anchor"], "gt": parts["gt"].repeat_interleave(VERSIONS, dim=0)}

    def bench_batch(self, lq: torch.Tensor, gt: torch.Tensor) -> tuple[dict[str, Any], int]:
        """``anysr bench``: the synthetic LQ as all five versions (as the loader workers hand them over)."""
        return {"lq": lq[:, None].repeat(1, VERSIONS - 2, 1, 1, 1), "anchor": lq[:, None].repeat(1, 2, 1, 1, 1),
                "gt": gt}, VERSIONS

    # ---------------------------------------------------------------- forward and losses
    def anchored_forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The outputs (b * 5 images, float32, in the versions' order) and the estimated degrees (b, 5, 2)."""
        with self.acc.precision.autocast():
            output, degrees = self.forward_g(batch["lq"], batch["anchor"])
        return self.training_output(output), degrees.float()

    def degree_loss_names(self) -> list[str]:
        names = ["l_ranking_blur", "l_ranking_noise", "l_anchor_min", "l_anchor_max"] if self.cri_rank else []
        return names + (["l_constraint_blur", "l_constraint_noise"] if self.cri_constraint is not None else [])

    def degree_losses(self, degrees: torch.Tensor) -> dict[str, torch.Tensor]:
        """The metric-learning losses on ``degrees`` (b, 5, 2: origin, blur, noise, clean anchor, degraded
        anchor; blur then noise degree), as the authors' models compute them."""
        blur, noise = degrees[..., 0], degrees[..., 1]
        out: dict[str, torch.Tensor] = {}
        if self.cri_rank is not None:
            assert self.cri_rank_b is not None
            out["l_ranking_blur"] = self.cri_rank_b(blur[:, 0], blur[:, 1], -1.0)
            out["l_ranking_noise"] = self.cri_rank(noise[:, 0], noise[:, 2], -1.0)
            shift = self.anchor_shift
            out["l_anchor_min"] = (((blur[:, 3] + shift) ** 2).mean() + ((noise[:, 3] + shift) ** 2).mean()) \
                * self.anchor_weight
            out["l_anchor_max"] = (((blur[:, 4] - 1) ** 2).mean() + ((noise[:, 4] - 1) ** 2).mean()) \
                * self.anchor_weight
        if self.cri_constraint is not None:
            out["l_constraint_blur"] = self.cri_constraint(blur[:, 0], blur[:, 2])
            out["l_constraint_noise"] = self.cri_constraint(noise[:, 0], noise[:, 1])
        if not self.train_degrees:
            out = {k: v.detach() for k, v in out.items()}  # logged only: a constant adds no gradient
        return out

    def loss_names(self) -> list[str]:
        return super().loss_names() + self.degree_loss_names()  # type: ignore[misc]


@MODEL_REGISTRY.register()
class MMRealSRNetModel(_Anchored, SRModel):
    """MMRealSR's first stage: ``network_g`` (``MMRRDBNet``) trained with ``pixel_opt`` on all five versions of each
    GT and the degree losses. ``gt_usm: true`` sharpens the GT before the synthesis, trains towards the sharpened
    GT, and sharpens the clean anchor once more (the authors' model)."""

    loss_roles = ("pixel", "learned")

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.sharpen_input = self.keep_sharpened = bool(self.is_train and opt["gt_usm"])
        self._init_synthesis()

    def setup(self) -> None:
        super().setup()
        self._setup_synthesis()

    def compute_losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        output, degrees = self.anchored_forward(batch)
        # the LQ goes unread: no loss these models train reads it (LDL and match_lq_colors are refused)
        losses = self.loss_terms(output, batch["lq"], lambda role: batch["gt"])
        losses.update(self.degree_losses(degrees))
        return losses


@MODEL_REGISTRY.register()
class MMRealSRGANModel(_Anchored, SRGANModel):
    """MMRealSR's second stage: SRGANModel on all five versions of each GT (``network_g``: ``MMRRDBNet_decouple``,
    the estimator frozen), pixel + perceptual + GAN losses against the GT or its USM-sharpened copy
    (``l1_gt_usm``, ``percep_gt_usm``, ``gan_gt_usm``, as RealESRGANModel); the degree losses are logged, not
    trained (the authors' model). The synthesis starts from the plain GT."""

    loss_roles = ("pixel", "perceptual", "learned", "gan")
    anchor_shift = 0.05
    train_degrees = False

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.sharpen_input = self.keep_sharpened = False
        self._init_synthesis()
        self.usm_for = {"l1": bool(opt["l1_gt_usm"]), "percep": bool(opt["percep_gt_usm"]),
                        "gan": bool(opt["gan_gt_usm"])} if self.is_train else {}

    def setup(self) -> None:
        super().setup()
        self._setup_synthesis()

    def anchored_targets(self, parts: dict[str, torch.Tensor]) -> dict[str, Any]:
        """``gt`` is what the discriminator sees as real; ``l1_gt`` / ``percep_gt`` what the pixel and perceptual
        losses compare with: each the USM-sharpened GT or the GT as its flag says, once per output."""
        gt = parts["gt"]
        sharp = None
        if any(self.usm_for.values()):
            with torch.no_grad():
                sharp = self.usm(gt)

        def pick(name: str) -> torch.Tensor:
            chosen = sharp if self.usm_for[name] and sharp is not None else gt
            return chosen.repeat_interleave(VERSIONS, dim=0)

        return {"lq": parts["lq"], "anchor": parts["anchor"], "gt": pick("gan"), "l1_gt": pick("l1"),
                "percep_gt": pick("percep")}

    def generator_losses(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        output, degrees = self.anchored_forward(batch)
        losses = self.loss_terms(output, batch["lq"], lambda role: batch["percep_gt" if role in (
            "perceptual", "learned") else "l1_gt"])
        losses.update(self.degree_losses(degrees))
        losses.update(self.adversarial_terms(batch, output))
        return output, losses

    def judged_output(self, batch: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            return self.anchored_forward(batch)[0]
