"""Video models (BasicSR's): ``VideoBaseModel``, ``EDVRModel``, ``VideoRecurrentModel``, ``VideoRecurrentGANModel``.

They train like ``SRModel`` on (b, t, c, h, w) clips; what they add is BasicSR's video vocabulary:

* ``network_g.spynet_path`` / ``edvr_path`` name pretrained SPyNet / EDVR weights. The architecture never reads
  them: the model declares them as weight needs, and the engine loads them into ``net_g.spynet`` / ``net_g.edvr``
  (strictly, key ``params``, fresh runs only) before ``path.pretrain_network_g``, as BasicSR's constructors did.
* Parts of the network trained later: ``train.tsa_iter`` (EDVR: only the TSA fusion before it) and
  ``train.fix_flow`` (recurrent: SPyNet and IconVSR's EDVR branch frozen before it). Whether a parameter is frozen
  is a function of the iteration alone (set before every step), so a resumed run freezes exactly as the
  original. Frozen parameters get no gradient and the optimiser leaves them and their state alone (BasicSR's).
* Learning-rate factors per part: ``train.dcn_lr_mul`` (EDVR's deformable convolutions), ``train.flow_lr_mul``
  (SPyNet), ``train.lr_flow`` (the GAN model's SPyNet learning rate with ``fix_flow``), as separate param groups.

Validation of clips (per clip, averaged as BasicSR reports it) is ``anysr.engine.evaluation.evaluator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.errors import OptionError
from anysr.models.base import WeightNeed, build_optimizer
from anysr.models.gan import SRGANModel
from anysr.models.lr_scheduler import build_scheduler
from anysr.models.sr import SRModel
from anysr.registry import DATASET_REGISTRY, MODEL_REGISTRY, plain_options

# network_g key -> (sub-module of the network it fills, what it is)
_SUB_WEIGHTS = {"spynet_path": ("spynet", "SPyNet"), "edvr_path": ("edvr", "EDVR")}
WEIGHT_PATH_ARGS = tuple(_SUB_WEIGHTS)  # BasicSR's network_g keys naming weights of a sub-network
DEFAULT_EVAL_FRAMES = 5  # frames of a recurrent network's representative clip when nothing says more
TIMING_FRAMES, TIMING_SIDE = 3, 64  # the largest clip the hardware choices are timed on


@MODEL_REGISTRY.register()
class VideoBaseModel(SRModel):
    """SRModel over clips: ``lq`` (b, t, c, h, w) -> ``gt`` (b, c, H, W) (window networks such as EDVR) or
    (b, t, c, H, W) (recurrent networks); pixel losses on the whole output."""

    weight_path_args = WEIGHT_PATH_ARGS  # network_g keys naming weight files (the options resolve and check them)
    loss_roles: tuple[str, ...] = ("pixel",)  # clips: no EMA-output (LDL) or learned image losses
    freeze_option: str | None = None  # train.<key>: parts frozen before that iteration
    lr_mul_option: str | None = None  # train.<key>: learning-rate factor of those parts
    image_batches = False  # clips: no batch augmentations (train.use_moa)
    takes_clips = True  # net_g is a video network (or an image network run frame by frame)

    def __init__(self, opt: dict[str, Any], accelerator: Accelerator) -> None:
        super().__init__(opt, accelerator)
        if self.is_train and self.freeze_until() and accelerator.world_size > 1 and not opt["find_unused_parameters"]:
            raise OptionError(f"train.{self.freeze_option}: frozen parameters get no gradient, which DDP only allows "
                              "with find_unused_parameters: true (BasicSR's video files set it); add it")
        if accelerator.plan.spmd:
            raise OptionError("xla.spmd: SPMD shards 4-D image batches; video clips (5-D) train with one process "
                              "per device: set xla.spmd: false")
        self._frozen: bool | None = None

    # ---------------------------------------------------------------- the network and its weight files
    def generator_options(self) -> Any:
        net = plain_options(self.opt["network_g"])
        return {k: v for k, v in net.items() if k not in WEIGHT_PATH_ARGS}

    def weight_needs(self) -> list[WeightNeed]:
        """The sub-networks' pretrained weights (network_g.spynet_path / edvr_path) first, then the generator's."""
        needs = []
        net_g = self.nets["net_g"]
        for key, (attr, what) in _SUB_WEIGHTS.items():
            if key not in self.opt["network_g"] or not self.opt["network_g"][key]:
                continue
            sub = getattr(net_g, attr, None)
            if not isinstance(sub, nn.Module):
                raise OptionError(f"network_g.{key}: {self.opt['network_g']['type']} has no {what} part to load "
                                  f"it into; remove it")
            needs.append(WeightNeed(
                attr, f"network_g.{key}", self.opt["network_g"][key], _into(sub), param_key="params",
                key_option=f"network_g.{key} (a {what} weights file with a 'params' entry)"))
        return needs + super().weight_needs()

    def input_shape(self, batch: int, channels: int, size: int) -> tuple[int, ...]:
        """A small clip for timing the hardware choices (``calibrate``): one sample of at most
        ``TIMING_FRAMES`` frames (a window network's own count) and ``TIMING_SIDE`` pixels, since a video
        network's forward on a full training batch takes minutes on a CPU and the choice is relative."""
        del batch, channels  # the flow network's first convolution is not the input's: frames are RGB
        first = getattr(self.bare("net_g"), "conv_first", None)
        rgb = first.in_channels if isinstance(first, nn.Conv2d) else 3
        window = getattr(self.bare("net_g"), "num_frame", None)
        frames = window if isinstance(window, int) else min(self.clip_frames(), TIMING_FRAMES)
        side = min(size, TIMING_SIDE) // 4 * 4 or 4
        return (1, frames, rgb, side, side)

    def clip_frames(self) -> int:
        """Frames of a representative input: the network's window, else the training samples', else the
        validation chunk's."""
        window = getattr(self.bare("net_g"), "num_frame", None)
        if isinstance(window, int):
            return window
        if self.is_train:
            train = next(d for k, d in self.opt["datasets"].items() if k.startswith("train"))
            if train["type"] in DATASET_REGISTRY:
                frames = getattr(DATASET_REGISTRY.get(train["type"]), "sample_frames", None)
                n = frames(train) if frames is not None else None
                if n:
                    return int(n)
        val = self.opt["val"]
        if val is not None and val["chunk"]:
            return int(val["chunk"]) + 2 * int(val["chunk_pad"])
        return DEFAULT_EVAL_FRAMES

    # ---------------------------------------------------------------- parts trained later, lr factors
    @staticmethod
    def part_of(name: str) -> bool:
        """Whether parameter ``name`` belongs to the part that ``freeze_option`` / ``lr_mul_option`` address."""
        del name
        return False

    def freeze_until(self) -> int:
        if not self.is_train or self.freeze_option is None:
            return 0
        return int(self.opt["train"][self.freeze_option] or 0)

    def frozen_at(self, it: int) -> Callable[[str], bool] | None:
        """Which parameters are frozen at iteration ``it`` (None: none)."""
        until = self.freeze_until()
        return self.frozen_part if until and it < until else None

    def frozen_part(self, name: str) -> bool:
        return self.part_of(name)

    def update_learning_rate(self, current_iter: int) -> None:
        rule = self.frozen_at(current_iter)
        frozen = rule is not None
        if frozen != self._frozen and self.is_train:
            for name, p in self.bare("net_g").named_parameters():
                p.requires_grad_(not (rule is not None and rule(name)))
            self._frozen = frozen
        super().update_learning_rate(current_iter)

    def param_groups(self, net: nn.Module, optim_opt: Any) -> list[dict[str, Any]] | None:
        """Separate param groups when a part has its own learning rate (None: one group)."""
        mul = float(self.opt["train"][self.lr_mul_option]) if self.lr_mul_option else 1.0
        if mul == 1.0:
            return None
        lr = float(optim_opt["lr"])
        named = list(net.named_parameters())
        return [{"params": [p for n, p in named if not self.part_of(n)], "lr": lr},
                {"params": [p for n, p in named if self.part_of(n)], "lr": lr * mul}]

    def add_optimizer(self, name: str, net: nn.Module, opt: dict[str, Any], key_path: str) -> None:
        groups = self.param_groups(self.acc.strategy.unwrap(net), opt) if name == "net_g" else None
        if groups is None:
            super().add_optimizer(name, net, opt, key_path)
            return
        self.optimizers[name] = build_optimizer(groups, opt, key_path)  # type: ignore[arg-type]
        train = self.opt["train"]
        self.schedulers[name] = build_scheduler(self.optimizers[name], train["scheduler"], int(train["warmup_iter"]))


def _into(sub: nn.Module) -> Callable[[Any, Callable[[nn.Module, Any], None]], None]:
    return lambda sd, load: load(sub, sd)


@MODEL_REGISTRY.register()
class EDVRModel(VideoBaseModel):
    """EDVR training: ``train.tsa_iter`` (only the TSA fusion module trains before it) and ``train.dcn_lr_mul``
    (the deformable convolutions' learning-rate factor)."""

    freeze_option = "tsa_iter"
    lr_mul_option = "dcn_lr_mul"

    @staticmethod
    def part_of(name: str) -> bool:
        return "dcn" in name

    def frozen_part(self, name: str) -> bool:
        return "fusion" not in name  # everything but TSA fusion waits


@MODEL_REGISTRY.register()
class VideoRecurrentModel(VideoBaseModel):
    """BasicVSR / IconVSR / BasicVSR++ training: ``train.fix_flow`` (SPyNet and IconVSR's EDVR branch frozen
    before it) and ``train.flow_lr_mul`` (SPyNet's learning-rate factor). Validation: ``val.flip_seq``,
    ``val.center_frame_only``, ``val.chunk`` (see ``anysr.engine.evaluation.evaluator``)."""

    freeze_option = "fix_flow"
    lr_mul_option = "flow_lr_mul"

    @staticmethod
    def part_of(name: str) -> bool:
        return "spynet" in name

    def frozen_part(self, name: str) -> bool:
        return "spynet" in name or "edvr" in name


@MODEL_REGISTRY.register()
class VideoRecurrentGANModel(VideoRecurrentModel, SRGANModel):
    """A recurrent generator against a frame discriminator (``network_d`` sees every frame of the clips): pixel,
    perceptual and GAN losses on the frames, as SRGANModel. With ``train.fix_flow``, ``train.lr_flow`` is SPyNet's
    learning rate (BasicSR's)."""

    loss_roles = ("pixel", "perceptual", "gan")

    def param_groups(self, net: nn.Module, optim_opt: Any) -> list[dict[str, Any]] | None:
        train = self.opt["train"]
        if train["fix_flow"] and train["lr_flow"] is not None:
            named = list(net.named_parameters())
            return [{"params": [p for n, p in named if self.part_of(n)], "lr": float(train["lr_flow"])},
                    {"params": [p for n, p in named if not self.part_of(n)], "lr": float(optim_opt["lr"])}]
        return super().param_groups(net, optim_opt)

    def setup(self) -> None:
        super().setup()
        if self.is_train:
            clip_forward = self.forward_g
            self.forward_g = lambda lq: clip_forward(lq).flatten(0, 1)  # frames, as the discriminator sees them

    def train_step(self, batches: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        frames = [{**b, "gt": b["gt"].flatten(0, 1)} if b["gt"].dim() == 5 else b for b in batches]
        return super().train_step(frames)


@MODEL_REGISTRY.register()
class VideoGANModel(VideoBaseModel, SRGANModel):
    """A window generator (clip in, centre frame out: EDVR, traiNNer-redux's temporal networks) against an image
    discriminator on its output frames: pixel, perceptual, learned image (the output is an image batch) and GAN
    losses, as SRGANModel."""

    loss_roles = ("pixel", "perceptual", "learned", "gan")


__all__ = ["EDVRModel", "VideoBaseModel", "VideoGANModel", "VideoRecurrentGANModel", "VideoRecurrentModel"]
