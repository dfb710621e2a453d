"""RealESRNetModel and RealESRGANModel: blind SR trained on pairs synthesised on the fly (Real-ESRGAN, Wang et al.
2021; BasicSR 1.4.2's and the Real-ESRGAN project's models and option keys).

Per micro-batch of a training step (``high_order_degradation: true``):

1. the LQ is synthesised from the GT and the dataset's kernels by the second-order pipeline
   (:mod:`anysr.data.degradation.realesrgan`): here, on the accelerator's device, one set of resize / noise / JPEG
   choices per batch as BasicSR (``degrade_in: step``); or per sample in the DataLoader workers (``degrade_in: loader``,
   what ``auto`` picks on XLA: the device then only sees fixed shapes and compiles one graph);
2. a ``gt_size`` crop (BasicSR's ``paired_random_crop``), then the training-pair pool (``queue_size``,
   :class:`~anysr.data.pair_pool.TrainingPairPool`), whose contents are part of the training state;
3. the losses: RealESRNet's pixel loss against the GT (USM-sharpened before the degradation with ``gt_usm``);
   RealESRGAN's pixel, perceptual and GAN losses against the GT or its USM-sharpened copy (``l1_gt_usm``,
   ``percep_gt_usm``, ``gan_gt_usm``), the discriminator updated as SRGANModel does (``net_d_iters``,
   ``net_d_init_iters``).

With ``high_order_degradation: false`` the dataset's LQ/GT pairs train as they are (Real-ESRGAN's paired
fine-tuning, e.g. ``RealESRGANPairedDataset``). Validation never synthesises: it reads the validation pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from anysr.accelerators import Accelerator
from anysr.data.degradation.realesrgan import (
    LoaderSynthesis,
    SynthesisSettings,
    draw_batch_choices,
    pool_rng,
    sample_generator,
    step_rng,
    synthesise,
)
from anysr.data.imageio import write_image
from anysr.data.pair_pool import TrainingPairPool, wide_keys
from anysr.data.transforms import tensor2img
from anysr.errors import DataError, OptionError
from anysr.models.gan import SRGANModel
from anysr.models.sr import SRModel
from anysr.ops.degradation import USMSharp
from anysr.ops.diffjpeg import DiffJPEG
from anysr.registry import MODEL_REGISTRY

__all__ = ["RealESRGANModel", "RealESRNetModel"]

_KERNELS = ("kernel1", "kernel2", "sinc_kernel")


class _Synthesis:
    """What both models share: synthesis, pool, USM, and the pool in the training state (a mixin of SRModel)."""

    opt: Any
    acc: Accelerator
    is_train: bool
    synthesises = True  # the options pair these models with a synthesis source (RealESRGANDataset)
    sharpen_input = True  # whether the degradation starts from the USM-sharpened GT
    keep_sharpened = False  # whether the pooled / trained GT is the sharpened one

    def _init_synthesis(self) -> None:
        opt = self.opt
        self.high_order = bool(self.is_train and opt["high_order_degradation"])
        self.current_iter = 0
        self._debug_saved = 0
        self.usm = USMSharp()
        self.settings: SynthesisSettings | None = None
        self.pool: TrainingPairPool | None = None
        self.degrade_in = "none"
        self._gens: list[torch.Generator] = []
        if not self.high_order:
            return
        self.settings = SynthesisSettings.from_options(opt)
        self.jpeger = DiffJPEG(differentiable=False)
        if int(opt["queue_size"]) > 0:
            self.pool = TrainingPairPool(int(opt["queue_size"]), {"lq": True, "gt": not self.keep_sharpened})
        where = str(opt["degrade_in"])
        if where == "auto":
            where = "loader" if self.acc.static_shapes else "step"
        elif where == "step" and self.acc.static_shapes:
            raise OptionError(f"degrade_in: step on {self.acc.name} would compile a new graph for every random "
                              "resize; use degrade_in: loader (or auto), which synthesises in the DataLoader workers")
        self.degrade_in = where

    def _setup_synthesis(self) -> None:
        self.usm = self.usm.to(self.acc.device)
        if self.high_order:
            self.jpeger = self.jpeger.to(self.acc.device)

    # ---------------------------------------------------------------- the engine's hooks
    def prepare_train_set(self, dataset: Any) -> None:
        """With ``degrade_in: loader``, hand the synthesis to the training set (it runs in the loader workers)."""
        if self.degrade_in != "loader":
            return
        attach = getattr(dataset, "attach_synthesis", None)
        if attach is None:
            raise OptionError(f"degrade_in: loader needs a dataset that synthesises (RealESRGANDataset), got "
                              f"{type(dataset).__name__}")
        assert self.settings is not None
        attach(LoaderSynthesis(self.settings, sharpen_input=self.sharpen_input, keep_sharpened=self.keep_sharpened))

    def _local_batch(self) -> int:
        key = next(k for k in self.opt["datasets"] if k.startswith("train"))
        return int(self.opt["datasets"][key]["batch_size_per_gpu"]) * self.acc.batch_multiplier

    # ---------------------------------------------------------------- synthesis, crop, pool
    def _generators(self, n: int) -> list[torch.Generator]:
        while len(self._gens) < n:
            self._gens.append(sample_generator(self.acc.device))
        return self._gens[:n]

    def _synthesise(self, batch: dict[str, Any], micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [k for k in ("gt", *_KERNELS, "seed") if k not in batch]
        if missing:
            raise DataError(f"{type(self).__name__} synthesises its LQ from a RealESRGANDataset batch (gt, kernels, "
                            f"seed); this batch lacks {', '.join(missing)}")
        assert self.settings is not None
        gt = batch["gt"]
        seed = int(self.opt["manual_seed"])
        choices = draw_batch_choices(step_rng(seed, self.current_iter, micro), self.settings, tuple(gt.shape[-2:]))
        seeds = [int(s) for s in batch["seed"]]
        out = synthesise(gt, [batch[k] for k in _KERNELS], settings=self.settings, choices=choices, seeds=seeds,
                         gens=self._generators(len(seeds)), usm=self.usm, jpeger=self.jpeger,
                         sharpen_input=self.sharpen_input, keep_sharpened=self.keep_sharpened)
        return out["lq"], out["gt"]

    def training_pair(self, batch: dict[str, Any], micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (LQ, GT) that train on micro-batch ``micro`` of this iteration: synthesised (unless the loader did),
        cropped, passed through the pool. Without high-order degradation: the batch's own pair."""
        if not self.high_order:
            return batch["lq"], batch["gt"]
        with torch.no_grad():
            if "lq" in batch:  # synthesised in the loader workers (or a ready-made batch: anysr bench)
                lq, gt = batch["lq"], batch["gt"]
            else:
                lq, gt = self._synthesise(batch, micro)
            if self.pool is not None:
                b = lq.shape[0]
                out = self.pool.swap({"lq": lq, "gt": gt}, pool_rng(int(self.opt["manual_seed"]), self.current_iter,
                                                                       micro),
                                     offset=self.acc.rank * b, global_batch=self.acc.world_size * b,
                                     to_device=self.acc.to_device, wide=wide_keys(batch))
                lq, gt = out["lq"], out["gt"]
            self._debug_save(lq, gt, micro)
        return lq.contiguous(), gt

    def _debug_save(self, lq: torch.Tensor, gt: torch.Tensor, micro: int) -> None:
        """``high_order_degradations_debug``: the first rank writes the batch's LQ and GT as two PNG rows
        (``<iteration>_<micro>_otf_lq.png`` / ``_otf_gt.png`` in experiments/<name>/debug/otf), up to
        ``high_order_degradations_debug_limit`` batches per run (0: all). Copies the batch to the host."""
        if not self.opt.get("high_order_degradations_debug") or not self.acc.is_main:
            return
        limit = int(self.opt.get("high_order_degradations_debug_limit") or 0)
        if limit and self._debug_saved >= limit:
            return
        folder = Path(self.opt["path"]["experiments_root"]) / "debug" / "otf"
        for name, x in (("lq", lq), ("gt", gt)):
            row = torch.cat(list(x.detach().float().cpu()), dim=-1)
            write_image(folder / f"{self.current_iter:06d}_{micro}_otf_{name}.png", tensor2img(row))
        self._debug_saved += 1

    def _fed(self, batches: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.targets(*self.training_pair(batch, k)) for k, batch in enumerate(batches)]

    def targets(self, lq: torch.Tensor, gt: torch.Tensor) -> dict[str, Any]:
        """The batch the losses read (the models say which GT each loss uses)."""
        return {"lq": lq, "gt": gt}

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return super().train_step(self._fed(batches))  # type: ignore[misc]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = super().state_dict()  # type: ignore[misc]
        if self.pool is not None:
            state["pool"] = self.pool.state_dict(self.acc.strategy.all_gather_object, self.acc.to_host)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # type: ignore[misc]
        if self.pool is not None and "pool" in state:
            b = self._local_batch()
            self.pool.load_state_dict(state["pool"], offset=self.acc.rank * b, batch=b, where="the training state")


@MODEL_REGISTRY.register()
class RealESRNetModel(_Synthesis, SRModel):
    """``network_g`` trained with ``pixel_opt`` on synthesised pairs (Real-ESRGAN's first stage).

    ``gt_usm: true`` sharpens the GT before the degradation and trains towards the sharpened GT, as BasicSR does.
    """

    fsam_steps = True

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self.sharpen_input = self.keep_sharpened = bool(self.is_train and opt["gt_usm"])
        self._init_synthesis()

    def setup(self) -> None:
        super().setup()
        self._setup_synthesis()

    def update_learning_rate(self, current_iter: int) -> None:
        self.current_iter = current_iter
        super().update_learning_rate(current_iter)


@MODEL_REGISTRY.register()
class RealESRGANModel(_Synthesis, SRGANModel):
    """SRGANModel on synthesised pairs (Real-ESRGAN's second stage): pixel + perceptual + GAN losses.

    The degradation starts from the USM-sharpened GT; each loss trains towards the sharpened GT or the plain one
    (``l1_gt_usm``, ``percep_gt_usm``, ``gan_gt_usm``; x4plus: true, true, false). The adversarial losses are
    SRGAN's (not ESRGAN's relativistic ones), as in Real-ESRGAN.
    """

    fsam_steps = True

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        self._init_synthesis()
        self.usm_for = {"l1": bool(opt["l1_gt_usm"]), "percep": bool(opt["percep_gt_usm"]),
                        "gan": bool(opt["gan_gt_usm"])} if self.is_train else {}

    def setup(self) -> None:
        super().setup()
        self._setup_synthesis()

    def targets(self, lq: torch.Tensor, gt: torch.Tensor) -> dict[str, Any]:
        """``gt`` is what the discriminator sees as real; ``l1_gt`` / ``percep_gt`` what the pixel and perceptual
        losses compare with: each the USM-sharpened GT or the GT as its flag says."""
        sharp = None
        if any(self.usm_for.values()):
            with torch.no_grad():
                sharp = self.usm(gt)

        def pick(name: str) -> torch.Tensor:
            return sharp if self.usm_for[name] and sharp is not None else gt

        return {"lq": lq, "gt": pick("gan"), "l1_gt": pick("l1"), "percep_gt": pick("percep")}

    def generator_losses(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with self.acc.precision.autocast():
            output = self.forward_g(batch["lq"])
        output = self.training_output(output)
        # pixel-like losses (pixel, artifact) against l1_gt; perceptual and learned ones against percep_gt
        losses = self.loss_terms(output, batch["lq"], lambda role: batch["percep_gt" if role in (
            "perceptual", "learned") else "l1_gt"])
        losses.update(self.adversarial_terms(batch, output))
        return output, losses
