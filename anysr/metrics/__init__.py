"""Image-quality metrics, registered in ``METRIC_REGISTRY`` under BasicSR's names and short aliases."""

from anysr.metrics.psnr_ssim import calculate_psnr, calculate_ssim, psnr_torch, ssim_torch
from anysr.registry import METRIC_REGISTRY

for _name, _fn in (
    ("calculate_psnr", calculate_psnr),
    ("psnr", calculate_psnr),
    ("calculate_ssim", calculate_ssim),
    ("ssim", calculate_ssim),
    ("calculate_psnr_pt", psnr_torch),
    ("calculate_ssim_pt", ssim_torch),
):
    METRIC_REGISTRY.register(_fn, name=_name)

# numpy metric name -> its device-side torch twin (same numbers on quantised tensors).
TORCH_METRICS = {
    "calculate_psnr": psnr_torch,
    "psnr": psnr_torch,
    "calculate_psnr_pt": psnr_torch,
    "calculate_ssim": ssim_torch,
    "ssim": ssim_torch,
    "calculate_ssim_pt": ssim_torch,
}

__all__ = ["calculate_psnr", "calculate_ssim", "psnr_torch", "ssim_torch", "TORCH_METRICS"]
