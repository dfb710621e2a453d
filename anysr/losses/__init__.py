"""Losses (pure torch.nn), registered by name for ``train.*_opt: {type: ...}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from anysr.archs.vgg_features import VGGFeatureExtractor
from anysr.losses.adists import ADISTSLoss
from anysr.losses.artifact import LDLLoss, artifact_map
from anysr.losses.color import ChromaLoss, LumaLoss, OklabLoss
from anysr.losses.downscaled import AverageLoss, BicubicLoss, ColorLoss, CosimLoss, NCCLoss
from anysr.losses.fdl import FrequencyDistributionLoss
from anysr.losses.feature_nets import AESOPLoss, LineDistillerLoss, PerceptualAnimeLoss
from anysr.losses.flip import FLIPLoss
from anysr.losses.frequency import FFLoss, FFTLoss
from anysr.losses.gan import (
    GANFeatLoss,
    GANLoss,
    MultiScaleGANLoss,
    gradient_penalty_loss,
    path_length_penalty,
    r1_penalty,
    relativistic_discriminator_loss,
    relativistic_generator_loss,
)
from anysr.losses.gradient import GradientVarianceLoss, SobelLoss
from anysr.losses.learned import ContextualLoss, DISTSLoss, LPIPSLoss
from anysr.losses.neosr_basic import (
    ArtifactWeightedLoss,
    CHCLoss,
    ConsistencyLoss,
    FocalFrequencyLoss,
    KLDivergenceLoss,
    LabelledGANLoss,
    MSSWDLoss,
    PaddedMSSSIMLoss,
)
from anysr.losses.neosr_perceptual import RawDISTSLoss, VGGPerceptualLoss
from anysr.losses.perceptual import PerceptualLoss
from anysr.losses.pixel import CharbonnierLoss, HuberLoss, L1Loss, MSELoss, WeightedTVLoss
from anysr.losses.ranking import MarginRankingLoss
from anysr.losses.structure import MSSSIML1Loss, MSSSIMLoss, SSIMLoss
from anysr.losses.structure_texture import StructureTextureLoss
from anysr.losses.trainner import HSLuvLoss, MSSIMLoss, PSNRLoss
from anysr.registry import LOSS_REGISTRY, plain_options


def build_loss(opt: Mapping[str, Any], key_path: str) -> nn.Module:
    """Build the loss named by ``opt['type']`` with the other keys as arguments."""
    kwargs = plain_options(opt)
    cls = LOSS_REGISTRY.get(kwargs.pop("type"), f"{key_path}.type")
    return cls(**kwargs)


__all__ = ["AESOPLoss", "LineDistillerLoss", "PerceptualAnimeLoss", "ADISTSLoss", "FLIPLoss",
           "AverageLoss", "BicubicLoss", "ColorLoss", "CosimLoss", "NCCLoss", "StructureTextureLoss",
           "CharbonnierLoss", "ChromaLoss", "ContextualLoss", "DISTSLoss", "FFLoss", "FFTLoss", "GANFeatLoss",
           "GANLoss", "GradientVarianceLoss", "HSLuvLoss", "HuberLoss", "L1Loss", "LDLLoss", "LPIPSLoss", "LumaLoss",
           "MSELoss", "MSSIMLoss", "MSSSIML1Loss", "MSSSIMLoss", "MultiScaleGANLoss", "OklabLoss", "PSNRLoss",
           "PerceptualLoss", "SSIMLoss", "SobelLoss", "VGGFeatureExtractor", "WeightedTVLoss", "artifact_map",
           "build_loss", "gradient_penalty_loss", "path_length_penalty", "r1_penalty",
           "relativistic_discriminator_loss", "relativistic_generator_loss", "RawDISTSLoss", "VGGPerceptualLoss",
           "ArtifactWeightedLoss", "CHCLoss", "ConsistencyLoss", "FocalFrequencyLoss", "KLDivergenceLoss",
           "LabelledGANLoss", "MSSWDLoss", "PaddedMSSSIMLoss", "FrequencyDistributionLoss", "MarginRankingLoss"]
