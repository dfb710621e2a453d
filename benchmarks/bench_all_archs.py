"""Every image architecture (and clip network, on 5-frame clips) at a published size: parameters, FLOPs, one
training step and a 256x256 inference.

    PYTHONPATH=. python benchmarks/bench_all_archs.py [--accelerator cpu|cuda|mps|xla] [--iters 3] [--only HAT DAT-S]

Prints one Markdown table row per architecture as it finishes:

- params: trainable parameters of the training form, and (where they differ: SPAN, ECBSR) those of the modules
  that one inference forward of the deployed form runs.
- GFLOPs: one forward for a 256x256 output (``anysr.engine.bench.forward_flops``: Conv2d and Linear,
  2 x multiply-adds; attention matmuls not counted).
- train ms: one step (forward, L1 loss, backward, Adam step) on batch 1 with a 128x128 GT crop (32x32 LQ at x4,
  128x128 at x1), training mode, fp32 and under bf16 autocast.
- infer ms: one forward for a 256x256 output (64x64 LQ at x4, 256x256 at x1), eval mode, ``torch.no_grad()``.

Each time is the best of ``--iters`` timed runs after ``--warmup`` (the least disturbed; the median is printed
too). The load average at each row's start is printed, so disturbed rows can be told apart.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators import Accelerator
from anysr.accelerators.launcher import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.archs.nafnet_arch import NAFNET_CONFIGS
from anysr.engine.bench import forward_flops

OUT_SIZE = 256
GT_CROP = 128

# name -> (options, scale, input channels); the authors' published sizes.
CONFIGS: dict[str, tuple[dict[str, Any], int, int]] = {
    "MSRResNet": ({"type": "MSRResNet"}, 4, 3),
    "EDSR-M": ({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 4}, 4, 3),
    "RCAN": ({"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3, "upscale": 4}, 4, 3),
    "RRDBNet (ESRGAN)": ({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3}, 4, 3),
    "SRVGGNetCompact": ({"type": "SRVGGNetCompact"}, 4, 3),
    "SwinIR-M (classical)": ({"type": "SwinIR", "upscale": 4, "img_size": 48, "window_size": 8, "img_range": 1.0,
                              "depths": [6] * 6, "embed_dim": 180, "num_heads": [6] * 6, "mlp_ratio": 2,
                              "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "HAT-S": ({"type": "HAT", "upscale": 4, "img_size": 64, "window_size": 16, "compress_ratio": 24,
               "squeeze_factor": 24, "conv_scale": 0.01, "overlap_ratio": 0.5, "depths": [6] * 6, "embed_dim": 144,
               "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "HAT": ({"type": "HAT", "upscale": 4, "img_size": 64, "window_size": 16, "compress_ratio": 3,
             "squeeze_factor": 30, "conv_scale": 0.01, "overlap_ratio": 0.5, "depths": [6] * 6, "embed_dim": 180,
             "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "DAT-light": ({"type": "DAT", "upscale": 4, "img_size": 64, "depth": [18], "embed_dim": 60, "num_heads": [6],
                   "expansion_factor": 2, "resi_connection": "3conv", "split_size": [8, 32],
                   "upsampler": "pixelshuffledirect"}, 4, 3),
    "DAT-S": ({"type": "DAT", "upscale": 4, "img_size": 64, "split_size": [8, 16], "depth": [6] * 6,
               "embed_dim": 180, "num_heads": [6] * 6, "expansion_factor": 2, "resi_connection": "1conv"}, 4, 3),
    "DAT-2": ({"type": "DAT", "upscale": 4, "img_size": 64, "split_size": [8, 32], "depth": [6] * 6,
               "embed_dim": 180, "num_heads": [6] * 6, "expansion_factor": 2, "resi_connection": "1conv"}, 4, 3),
    "DRCT": ({"type": "DRCT", "upscale": 4, "img_size": 64, "window_size": 16, "depths": [6] * 6, "embed_dim": 180,
              "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "SPAN (48 ch)": ({"type": "SPAN", "feature_channels": 48}, 4, 3),
    "RealPLKSR (layer norm)": ({"type": "RealPLKSR", "layer_norm": True}, 4, 3),
    "RealPLKSR + DySample": ({"type": "RealPLKSR", "layer_norm": True, "dysample": True}, 4, 3),
    "OmniSR": ({"type": "OmniSR", "res_num": 5}, 4, 3),
    "SAFMN": ({"type": "SAFMN", "dim": 36}, 4, 3),
    "SAFMN-L": ({"type": "SAFMN", "dim": 128, "n_blocks": 16}, 4, 3),
    "ECBSR-M4C16 (Y)": ({"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 4, "num_channel": 16,
                         "with_idt": False, "act_type": "prelu", "scale": 4}, 4, 1),
    "RIDNet": ({"type": "RIDNet", "in_channels": 3, "mid_channels": 64, "out_channels": 3}, 1, 3),
    "NAFNet-SIDD-width32": ({"type": "NAFNet", **NAFNET_CONFIGS["NAFNet-SIDD-width32"]}, 1, 3),
    "NAFNet-SIDD-width64": ({"type": "NAFNet", **NAFNET_CONFIGS["NAFNet-SIDD-width64"]}, 1, 3),
    "SCUNet": ({"type": "SCUNet"}, 1, 3),
    # added 2026-12-02 (issue 18): the newer families at a published size (a preset name where one exists)
    "ATD-light": ({"type": "atd_light", "scale": 4}, 4, 3),
    "ArtCNN R8F64": ({"type": "artcnn_r8f64", "scale": 4}, 4, 3),
    "CRAFT": ({"type": "craft", "scale": 4}, 4, 3),
    "DCTLSA": ({"type": "dctlsa", "scale": 4}, 4, 3),
    "DIS-balanced": ({"type": "dis_balanced", "scale": 4}, 4, 3),
    "DITN-real": ({"type": "ditn_real", "scale": 4}, 4, 3),
    "EIMN-L": ({"type": "eimn_l", "scale": 4}, 4, 3),
    "ELAN-light": ({"type": "elan_light", "scale": 4}, 4, 3),
    "ESCRealM-XL": ({"type": "escrealm_xl", "scale": 4}, 4, 3),
    "FDAT-light": ({"type": "fdat_light", "scale": 4}, 4, 3),
    "HiT-SRF": ({"type": "hit_srf", "scale": 4}, 4, 3),
    "LKFMixer-B": ({"type": "lkfmixer_b", "scale": 4}, 4, 3),
    "LMLT-base": ({"type": "lmlt_base", "scale": 4}, 4, 3),
    "MAN-light": ({"type": "man_light", "scale": 4}, 4, 3),
    "MoESR": ({"type": "MoESR", "scale": 4}, 4, 3),
    "MoSR": ({"type": "mosr", "scale": 4}, 4, 3),
    "MoSRv2": ({"type": "MoSRv2", "scale": 4}, 4, 3),
    "PLKSR": ({"type": "plksr", "scale": 4}, 4, 3),
    "RGT-S": ({"type": "rgt_s", "scale": 4}, 4, 3),
    "RTMoSR-L": ({"type": "rtmosr_l", "scale": 4}, 4, 3),
    "SAFMN-BCIE": ({"type": "SAFMNBCIE", "dim": 36}, 1, 3),
    "Sebica-mini": ({"type": "sebica_mini", "scale": 4}, 4, 3),
    "SeemoRe-T": ({"type": "seemore_t", "scale": 4}, 4, 3),
    "SpanPlus": ({"type": "spanplus", "scale": 4}, 4, 3),
    "SPANF": ({"type": "spanf", "scale": 4}, 4, 3),
    "SPANF3": ({"type": "spanf3", "scale": 4}, 4, 3),
    "SPANF3 (x2, unshuffle)": ({"type": "spanf3", "scale": 2}, 2, 3),
    "SRFormer-light": ({"type": "srformer_light", "scale": 4}, 4, 3),
    "SRFormerV2": ({"type": "srformerv2", "scale": 4}, 4, 3),
    "Swin2SR-S": ({"type": "swin2sr_s", "scale": 4}, 4, 3),
    "SwiftSRGAN": ({"type": "SwiftSRGAN"}, 4, 3),
    "FlexNet": ({"type": "flexnet", "scale": 4}, 4, 3),
    "MetaFlexNet": ({"type": "metaflexnet", "scale": 4}, 4, 3),
    "DWT": ({"type": "dwt", "scale": 4}, 4, 3),
    "DWT-S": ({"type": "dwt_s", "scale": 4}, 4, 3),
    "HMA-medium (neosr)": ({"type": "hma_medium", "scale": 4}, 4, 3),
    "GRFormer-medium (neosr)": ({"type": "grformer_medium", "scale": 4}, 4, 3),
    "NinaSR-B0 (neosr)": ({"type": "ninasr_b0", "scale": 4}, 4, 3),
    "NinaSR-B2 (neosr)": ({"type": "ninasr_b2", "scale": 4}, 4, 3),
    "PlainUSR-ultra (neosr)": ({"type": "plainusr_ultra", "scale": 4}, 4, 3),
    "PlainUSR-large (neosr)": ({"type": "plainusr_large", "scale": 4}, 4, 3),
    "CFSR (neosr)": ({"type": "cfsr", "scale": 4}, 4, 3),
    "HASN (neosr)": ({"type": "hasn", "scale": 4}, 4, 3),
    "KRGN (neosr)": ({"type": "krgn", "scale": 4}, 4, 3),
    "MSDAN (neosr)": ({"type": "msdan", "scale": 4}, 4, 3),
    "ASID (neosr)": ({"type": "asid", "scale": 4}, 4, 3),
    "ASID-D8 (neosr)": ({"type": "asid_d8", "scale": 4}, 4, 3),
    "Light-SAFMN++ (neosr)": ({"type": "light_safmnpp", "scale": 4}, 4, 3),
    "CATANet (neosr)": ({"type": "catanet", "scale": 4}, 4, 3),
    "DCT (neosr)": ({"type": "dct", "scale": 4}, 4, 3),
    "DAT-iLN-light": ({"type": "dat_iln_light", "scale": 4}, 4, 3),
    "HAT-iLN-S": ({"type": "hat_iln_s", "scale": 4}, 4, 3),
    "EMT": ({"type": "emt", "scale": 4}, 4, 3),
    "RCAN (traiNNer-redux)": ({"type": "rcan", "scale": 4}, 4, 3),
    "RCAN-unshuffle (x2)": ({"type": "rcan_unshuffle", "scale": 2}, 2, 3),
    "GateRV3-S": ({"type": "gaterv3_s", "scale": 4}, 4, 3),
    "GateRV3-R": ({"type": "gaterv3_r", "scale": 4}, 4, 3),
    "SCUNet_aaf6aa (x4)": ({"type": "scunet_aaf6aa", "scale": 4}, 4, 3),
    "Real-CUGAN x2": ({"type": "UpCunet2x"}, 2, 3),
    "DnCNN (gray)": ({"type": "DnCNN"}, 1, 1),
    "DRUNet": ({"type": "DRUNet"}, 1, 1),
    "FBCNN": ({"type": "FBCNN"}, 1, 3),
    "FFTformer": ({"type": "FFTformer"}, 1, 3),
    "Restormer": ({"type": "Restormer"}, 1, 3),
    "DocRes-base": ({"type": "docres_base"}, 1, 3),
    "RetinexFormer": ({"type": "RetinexFormer"}, 1, 3),
    "HVI-CIDNet": ({"type": "HVICIDNet"}, 1, 3),
    "MixDehazeNet-S": ({"type": "MixDehazeNet"}, 1, 3),
    "CascadedGaze": ({"type": "cascadedgaze"}, 1, 3),
    "IPT (x4)": ({"type": "ipt", "scale": 4}, 4, 3),
    "MMRealSR (x4)": ({"type": "mmrealsr", "scale": 4}, 4, 3),
    "HiFaceGAN": ({"type": "hifacegan"}, 1, 3),
    # GFPGAN's train_gfpgan_v1.yml network (512-pixel faces: the cells' smaller inputs are padded to 512)
    "GFPGANv1 (512)": ({"type": "GFPGANv1", "out_size": 512, "channel_multiplier": 1, "input_is_latent": True,
                        "different_w": True, "sft_half": True, "fix_decoder": True}, 1, 3),
    # traiNNer-redux's temporal networks (clip in, centre frame out): their builders' defaults, 5-frame clips
    "TemporalSPAN": ({"type": "temporalspan", "scale": 4}, 4, 3),
    "TemporalSPANv2": ({"type": "temporalspanv2", "scale": 4}, 4, 3),
    "TSCUNet": ({"type": "tscunet", "scale": 4}, 4, 3),
    "TFDAT": ({"type": "tfdat", "scale": 4}, 4, 3),
    # traiNNer-redux's LAWFFT at its class defaults (whole-image blocks: torch.fft on CPU / CUDA, DFT matmuls on XLA)
    "LAWFFT": ({"type": "LAWFFT", "scale": 4}, 4, 3),
}
FRAMES = {"TemporalSPAN": 5, "TemporalSPANv2": 5, "TSCUNet": 5, "TFDAT": 5}  # clip networks: frames per input


def _input(in_ch: int, side: int, frames: int = 0) -> tuple[int, ...]:
    """One image (1, c, side, side), or one clip (1, frames, c, side, side) for a clip network."""
    return (1, frames, in_ch, side, side) if frames else (1, in_ch, side, side)


def _precision(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def _timed(fn: Callable[[], Any], acc: Accelerator, iters: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + iters):
        acc.synchronize()
        start = time.perf_counter()
        fn()
        acc.mark_step()
        acc.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def _train_times(net: nn.Module, acc: Accelerator, scale: int, in_ch: int, iters: int, warmup: int,
                 bf16: bool, frames: int = 0) -> list[float]:
    net.train()
    optim = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    lq = acc.to_device(torch.rand(_input(in_ch, GT_CROP // scale, frames), generator=gen))
    gt = acc.to_device(torch.rand(1, in_ch, GT_CROP, GT_CROP, generator=gen))

    def step() -> None:
        optim.zero_grad(set_to_none=True)
        with _precision(lq.device, bf16):
            loss = F.l1_loss(net(lq).float(), gt)
        loss.backward()
        optim.step()

    return _timed(step, acc, iters, warmup)


def _infer_times(net: nn.Module, x: torch.Tensor, acc: Accelerator, iters: int, warmup: int,
                 bf16: bool) -> list[float]:
    def forward() -> None:
        with torch.no_grad(), _precision(x.device, bf16):
            net(x)

    return _timed(forward, acc, iters, warmup)


def _deployed(net: nn.Module) -> nn.Module:
    """The inference form: ECBSR re-parameterised, SPAN in eval mode (its convs folded)."""
    net = copy.deepcopy(net).eval()
    if hasattr(net, "reparameterize"):
        net.reparameterize()
    return net


def _used_params(net: nn.Module, x: torch.Tensor) -> int:
    """Parameters of the modules one forward of ``net`` runs (SPAN's eval form skips its unfolded chains)."""
    called: set[nn.Module] = set()
    handles = [m.register_forward_hook(lambda mod, _i, _o: called.add(mod)) for m in net.modules()]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in handles:
            h.remove()
    return sum(p.numel() for m in called for p in m.parameters(recurse=False))


def _cell(times: list[float]) -> str:
    return f"{min(times):.0f} / {statistics.median(times):.0f}" if min(times) >= 10 else \
        f"{min(times):.1f} / {statistics.median(times):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="subset (run in this order) of: " + ", ".join(CONFIGS))
    args = parser.parse_args()

    acc = create_accelerator(resolve_plan(args.accelerator, 1))
    acc.setup()
    print(f"device: {acc.describe()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}; {args.iters} timed runs after {args.warmup} warm-up; "
          f"cells: best / median ms\n")
    print("| arch | scale | params (M) train / deployed | GFLOPs (256² out) | train fp32 | train bf16 | "
          "infer fp32 | infer bf16 | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    unknown = [n for n in args.only or [] if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown --only names {unknown}; choose from: {', '.join(CONFIGS)}")
    for name in args.only or list(CONFIGS):  # in the order given
        opt, scale, in_ch = CONFIGS[name]
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        torch.manual_seed(0)
        net = build_network(dict(opt))
        params = sum(p.numel() for p in net.parameters() if p.requires_grad) / 1e6
        deployed = _deployed(net)
        in_size = OUT_SIZE // scale
        frames = FRAMES.get(name, 0)
        params_dep = _used_params(deployed, torch.rand(_input(in_ch, 64 // scale, frames))) / 1e6
        flops, _ = forward_flops(deployed, _input(in_ch, in_size, frames))
        net, deployed = net.to(acc.device), deployed.to(acc.device)
        x = acc.to_device(torch.rand(_input(in_ch, in_size, frames), generator=torch.Generator().manual_seed(1)))
        train = [_cell(_train_times(net, acc, scale, in_ch, args.iters, args.warmup, bf16, frames))
                 for bf16 in (False, True)]
        infer = [_cell(_infer_times(deployed, x, acc, args.iters, args.warmup, bf16)) for bf16 in (False, True)]
        shown = f"{params:.3f}" if abs(params - params_dep) < 5e-4 else f"{params:.3f} / {params_dep:.3f}"
        print(f"| {name} | x{scale} | {shown} | {flops / 1e9:.1f} | {train[0]} | {train[1]} | {infer[0]} | "
              f"{infer[1]} | {load:.1f} |", flush=True)
        del net, deployed
    acc.teardown()


if __name__ == "__main__":
    main()
