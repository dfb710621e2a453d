"""Image-quality metrics, registered in ``METRIC_REGISTRY`` under BasicSR's names and short aliases.

Full-reference pixel metrics (PSNR, SSIM) are functions with a device twin in ``TORCH_METRICS``; NIQE is a numpy
function of one image; LPIPS and DISTS are modules comparing two batches; FID is the distance between two feature
statistics. ``metric_info(type)`` (``info.py``) says which kind a registered name is and which way is better.
"""

from anysr.metrics.dists import DISTS
from anysr.metrics.fid import calculate_fid
from anysr.metrics.info import METRIC_INFOS, MetricInfo, metric_info
from anysr.metrics.lpips import LPIPS
from anysr.metrics.niqe import calculate_niqe
from anysr.metrics.psnr_ssim import calculate_psnr, calculate_ssim, psnr_torch, ssim_torch
from anysr.metrics.raw_dists import RawDISTS
from anysr.metrics.topiq import TOPIQ
from anysr.registry import METRIC_REGISTRY

for _name, _fn in (
    ("calculate_psnr", calculate_psnr),
    ("psnr", calculate_psnr),
    ("calculate_ssim", calculate_ssim),
    ("ssim", calculate_ssim),
    ("calculate_psnr_pt", psnr_torch),
    ("calculate_ssim_pt", ssim_torch),
    ("calculate_niqe", calculate_niqe),
    ("niqe", calculate_niqe),
    ("calculate_lpips", LPIPS),
    ("lpips", LPIPS),
    ("calculate_dists", DISTS),
    ("dists", DISTS),
    ("calculate_raw_dists", RawDISTS),
    ("raw_dists", RawDISTS),
    ("calculate_topiq", TOPIQ),
    ("topiq", TOPIQ),
    ("calculate_fid", calculate_fid),
    ("fid", calculate_fid),
):
    METRIC_REGISTRY.register(_fn, name=_name)
    _fn.metric_info = metric_info(_name)  # type: ignore[attr-defined]  # what the options read (better, weights)

# numpy metric name -> its device-side torch twin (same numbers on quantised tensors).
TORCH_METRICS = {
    "calculate_psnr": psnr_torch,
    "psnr": psnr_torch,
    "calculate_psnr_pt": psnr_torch,
    "calculate_ssim": ssim_torch,
    "ssim": ssim_torch,
    "calculate_ssim_pt": ssim_torch,
}

__all__ = ["calculate_psnr", "calculate_ssim", "psnr_torch", "ssim_torch", "TORCH_METRICS", "calculate_niqe",
           "calculate_fid", "LPIPS", "DISTS", "RawDISTS", "TOPIQ", "METRIC_INFOS", "MetricInfo", "metric_info"]
