"""Models: what is optimised and how. ``model_type`` names one of these."""

from __future__ import annotations

from typing import Any

from anysr.accelerators import Accelerator
from anysr.models.base import BaseModel
from anysr.models.gan import ESRGANModel, SRGANModel
from anysr.models.gfpgan import GFPGANModel
from anysr.models.hifacegan import HiFaceGANModel
from anysr.models.mmrealsr import MMRealSRGANModel, MMRealSRNetModel
from anysr.models.realesrgan import RealESRGANModel, RealESRNetModel
from anysr.models.restoreformer import RestoreFormerModel
from anysr.models.sr import DATModel, DRCTModel, HATModel, SRModel, SwinIRModel
from anysr.models.stylegan2 import StyleGAN2Model
from anysr.models.video import EDVRModel, VideoBaseModel, VideoRecurrentGANModel, VideoRecurrentModel
from anysr.registry import MODEL_REGISTRY


def build_model(opt: Any, accelerator: Accelerator) -> BaseModel:
    """The model named by ``model_type`` (validated options)."""
    cls = MODEL_REGISTRY.get(opt["model_type"], key_path="model_type")
    return cls(opt, accelerator)


__all__ = ["BaseModel", "DATModel", "DRCTModel", "EDVRModel", "ESRGANModel", "GFPGANModel", "HATModel",
           "HiFaceGANModel", "MMRealSRGANModel", "MMRealSRNetModel", "RealESRGANModel", "RealESRNetModel",
           "RestoreFormerModel", "SRGANModel", "SRModel", "StyleGAN2Model", "SwinIRModel", "VideoBaseModel",
           "VideoRecurrentGANModel", "VideoRecurrentModel", "build_model"]
