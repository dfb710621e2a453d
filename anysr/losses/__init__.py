"""Losses (pure torch.nn), registered by name for ``train.*_opt: {type: ...}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from anysr.losses.gan import GANLoss
from anysr.losses.perceptual import PerceptualLoss, VGGFeatureExtractor
from anysr.losses.pixel import CharbonnierLoss, L1Loss, MSELoss
from anysr.registry import LOSS_REGISTRY, plain_options


def build_loss(opt: Mapping[str, Any], key_path: str) -> nn.Module:
    """Build the loss named by ``opt['type']`` with the other keys as arguments."""
    kwargs = plain_options(opt)
    cls = LOSS_REGISTRY.get(kwargs.pop("type"), f"{key_path}.type")
    return cls(**kwargs)


__all__ = ["CharbonnierLoss", "GANLoss", "L1Loss", "MSELoss", "PerceptualLoss", "VGGFeatureExtractor", "build_loss"]
