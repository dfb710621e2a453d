"""EDSR: Enhanced Deep Residual Networks for single-image super-resolution (Lim et al., 2017)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from anysr.archs.arch_util import ArchArgumentError, MeanShiftSR, ResidualBlockNoBN, make_layer
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


def mean_buffer(rgb_mean: Sequence[float], num_in_ch: int, owner: str) -> torch.Tensor:
    """``rgb_mean`` as a (1, C, 1, 1) tensor; C must be ``num_in_ch`` (or 3 for BasicSR's RGB default)."""
    mean = torch.tensor([float(v) for v in rgb_mean], dtype=torch.float32).view(1, -1, 1, 1)
    if mean.shape[1] not in (1, num_in_ch):
        raise ArchArgumentError(
            "rgb_mean",
            f"{owner} has num_in_ch={num_in_ch} but rgb_mean has {mean.shape[1]} values; "
            f"give {num_in_ch} values (one per input channel)",
        )
    return mean


@ARCH_REGISTRY.register()
class EDSR(MeanShiftSR):
    """EDSR: mean shift, residual blocks without BN, sub-pixel upsampling.

    Inputs in [0, 1] are centred with ``rgb_mean`` and scaled by ``img_range`` inside the network
    (the mean is a non-persistent buffer: it follows ``.to(device)`` but is not in the state dict,
    as in BasicSR). ``upscale``: a power of two or 3.
    """

    def __init__(self, num_in_ch: int, num_out_ch: int, num_feat: int = 64, num_block: int = 16,
                 upscale: int = 4, res_scale: float = 1, img_range: float = 255.0,
                 rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040)) -> None:
        super().__init__()
        self.init_layers(num_in_ch, num_out_ch, num_feat, upscale, img_range, mean_buffer(rgb_mean, num_in_ch, "EDSR"),
                         lambda: make_layer(ResidualBlockNoBN, num_block, num_feat=num_feat, res_scale=res_scale,
                                            pytorch_init=True))


GREY_MEAN = 0.43  # the mean of EDSR's default RGB means, for files of other channel counts


def _recognise(s: StateShapes) -> dict:
    """EDSR from its tensors: image channels from the first / last conv, width, depth from the blocks, the scale
    from the upsampler (one 9x-wide conv for x3, one 4x-wide conv per factor 2)."""
    feat, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    ups = [s.dim(f"upsample.{i}.weight", 0) for i in s.indices("upsample.")]
    if not ups or any(u not in (4 * feat, 9 * feat) for u in ups):
        return {}
    scale = 3 if ups == [9 * feat] else 2 ** len(ups)
    mean = {} if cin == 3 else {"rgb_mean": [GREY_MEAN]}  # not in the file; the default has one value per RGB channel
    return {"num_in_ch": cin, "num_out_ch": s.dim("conv_last.weight", 0), "num_feat": feat,
            "num_block": s.count("body."), "upscale": scale, **mean}


register_recogniser("EDSR", _recognise)


# BasicSR's published models (EDSR_Mx2/3/4, EDSR_Lx2/3/4): RGB in and out.
register_presets("EDSR", scale_arg="upscale", source="BasicSR", presets={
    "edsr_m": {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 64, "num_block": 16},
    "edsr_l": {"num_in_ch": 3, "num_out_ch": 3, "num_feat": 256, "num_block": 32, "res_scale": 0.1},
})
