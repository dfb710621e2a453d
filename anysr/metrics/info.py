"""What each metric is, for wiring it into ``val.metrics`` and ``anysr eval --metrics``.

``MetricInfo`` says which way is better, whether a ground truth is needed, under which BasicSR names users
know it, and which weight files (if any) the caller must load and hand over as state dicts. The metric
modules do no file I/O; ``WeightFile`` only documents what to read and where it is published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["MetricInfo", "WeightFile", "METRIC_INFOS", "PSNR_INFO", "SSIM_INFO", "NIQE_INFO", "LPIPS_INFO",
           "DISTS_INFO", "RAW_DISTS_INFO", "TOPIQ_INFO", "FID_INFO", "metric_info", "standard_weights"]


@dataclass(frozen=True)
class WeightFile:
    """One weight file a metric needs: what it holds, its usual file name and where it is published."""

    role: str
    file_name: str
    url: str
    layout: str


@dataclass(frozen=True)
class MetricInfo:
    """Description of one metric.

    ``better``: ``'lower'`` or ``'higher'``. ``needs_gt``: whether ground truth is needed (False for a
    no-reference metric such as NIQE). ``per_image``: False for a distribution metric (FID), computed over a
    whole set; its ground truth is the reference set (its images or precomputed statistics), not paired images.
    ``input``: what the function / module takes.
    """

    name: str
    basicsr_names: tuple[str, ...]
    better: Literal["lower", "higher"]
    needs_gt: bool
    per_image: bool
    input: str
    weights: tuple[WeightFile, ...] = field(default_factory=tuple)
    user_weights: tuple[WeightFile, ...] = field(default_factory=tuple)  # files the user names (none found by name)

    @property
    def lower_is_better(self) -> bool:
        return self.better == "lower"

    @property
    def needs_weights(self) -> bool:
        return bool(self.weights or self.user_weights)


_TV = "https://download.pytorch.org/models/"
ALEXNET_WEIGHTS = WeightFile("AlexNet backbone (torchvision alexnet)", "alexnet-owt-7be5be79.pth",
                             _TV + "alexnet-owt-7be5be79.pth", "torchvision: features.N.weight / .bias")
VGG16_WEIGHTS = WeightFile("VGG16 backbone (torchvision vgg16)", "vgg16-397923af.pth",
                           _TV + "vgg16-397923af.pth", "torchvision: features.N.weight / .bias")
_LPIPS_URL = "https://github.com/richzhang/PerceptualSimilarity/raw/master/lpips/weights/v0.1/"
LPIPS_ALEX_HEAD = WeightFile("LPIPS v0.1 linear head for alex", "alex.pth", _LPIPS_URL + "alex.pth",
                             "lpips: lin{0..4}.model.1.weight")
LPIPS_VGG_HEAD = WeightFile("LPIPS v0.1 linear head for vgg", "vgg.pth", _LPIPS_URL + "vgg.pth",
                            "lpips: lin{0..4}.model.1.weight")
DISTS_HEAD = WeightFile("DISTS alpha / beta", "weights.pt",
                        "https://github.com/dingkeyan93/DISTS/raw/master/DISTS_pytorch/weights.pt",
                        "DISTS_pytorch: alpha, beta (1, 1475, 1, 1)")
FID_INCEPTION = WeightFile("FID Inception-v3 (TensorFlow 2015-12-05 graph)", "pt_inception-2015-12-05-6726825d.pth",
                           "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/"
                           "pt_inception-2015-12-05-6726825d.pth",
                           "torchvision Inception3 with pytorch-fid's blocks: Conv2d_1a_3x3.conv.weight, ..., fc.*")

PSNR_INFO = MetricInfo("psnr", ("calculate_psnr", "calculate_psnr_pt"), "higher", True, True,
                       "two 0-255 images (numpy) or [0, 1] NCHW tensors")
SSIM_INFO = MetricInfo("ssim", ("calculate_ssim", "calculate_ssim_pt"), "higher", True, True,
                       "two 0-255 images (numpy) or [0, 1] NCHW tensors")
NIQE_INFO = MetricInfo("niqe", ("calculate_niqe",), "lower", False, True,
                       "one 0-255 BGR image (numpy, HWC/CHW) or a 2-D gray image")
LPIPS_INFO = MetricInfo("lpips", ("calculate_lpips",), "lower", True, True,
                        "two RGB NCHW tensors on [0, 1]",
                        (ALEXNET_WEIGHTS, VGG16_WEIGHTS, LPIPS_ALEX_HEAD, LPIPS_VGG_HEAD))
DISTS_INFO = MetricInfo("dists", ("calculate_dists",), "lower", True, True,
                        "two RGB NCHW tensors on [0, 1]", (VGG16_WEIGHTS, DISTS_HEAD))
RAW_DISTS_INFO = MetricInfo("raw_dists", ("calculate_raw_dists",), "lower", True, True,
                            "two RGB NCHW tensors on [0, 1] (not ImageNet-normalised: neosr's calculate_dists)",
                            (VGG16_WEIGHTS, DISTS_HEAD))
TOPIQ_FR_WEIGHTS = WeightFile("TOPIQ-FR (IQA-PyTorch's CFANet, KADID-10k, ResNet-50)",
                              "cfanet_fr_kadid_res50-2c4cc61d.pth",
                              "https://huggingface.co/chaofengc/IQA-PyTorch-Weights/resolve/main/"
                              "cfanet_fr_kadid_res50-2c4cc61d.pth", "IQA-PyTorch: params (semantic_model.*, ...)")
TOPIQ_INFO = MetricInfo("topiq", ("calculate_topiq",), "higher", True, True,
                        "two RGB NCHW tensors on [0, 1] (distorted, reference)", (), (TOPIQ_FR_WEIGHTS,))
FID_INFO = MetricInfo("fid", ("calculate_fid",), "lower", True, False,
                      "a set of RGB NCHW tensors on [0, 1] (or a folder) against reference statistics (mu, sigma)",
                      (FID_INCEPTION,))

METRIC_INFOS: dict[str, MetricInfo] = {i.name: i for i in (PSNR_INFO, SSIM_INFO, NIQE_INFO, LPIPS_INFO, DISTS_INFO,
                                                           FID_INFO, RAW_DISTS_INFO, TOPIQ_INFO)}


def metric_info(name: str) -> MetricInfo | None:
    """The description of a metric by short name (``'niqe'``) or BasicSR name (``'calculate_niqe'``)."""
    key = str(name).lower()
    if key in METRIC_INFOS:
        return METRIC_INFOS[key]
    for info in METRIC_INFOS.values():
        if key in info.basicsr_names:
            return info
    return None


# The standard files each learned metric reads when none are given, by the names of the engine's table
# (``anysr.engine.checkpoint.hub.KNOWN``), which finds or downloads them.
_STANDARD = {("lpips", "alex"): ("alexnet", "lpips_alex"), ("lpips", "vgg"): ("vgg16", "lpips_vgg"),
             ("dists", None): ("vgg16", "dists"), ("adists", None): ("vgg16",),
             ("raw_dists", None): ("vgg16", "dists"),
             ("fid", None): ("fid_inception",)}


def standard_weights(name: str, net: str | None = None) -> tuple[str, ...]:
    """The standard weight files of metric ``name`` (LPIPS: for backbone ``net``, alex by default), by name;
    empty for a metric that reads none."""
    if name == "lpips":
        return _STANDARD.get(("lpips", net or "alex"), ())
    return _STANDARD.get((name, None), ())
