"""Per-step cost of each loss, batch augmentation and optimizer, next to a real training step (issue 17).

    PYTHONPATH=. python benchmarks/bench_losses.py [--batch 8] [--gt 64] [--rounds 6] [--threads 1] \
        [--out benchmarks/losses.md]

- *step*: one real training step of SPAN x4 (48 channels) on a batch of ``batch`` LQ crops of ``gt / 4`` pixels:
  forward, L1, backward, AdamW step. Every other time is given as its share of this step.
- *losses*: forward + backward of the loss alone on a ``(batch, 3, gt, gt)`` output that needs a gradient (the
  network excluded). Learned losses (VGG, LPIPS, DISTS) with random weights: the time does not depend on their
  values. MS-SSIM with three scales (five need 161-pixel crops). GAN: the U-Net discriminator (64 features) the
  generator's loss runs through, and the discriminator's own update (real + fake, forward + backward).
- *augmentations*: ``train.use_moa`` with one kind drawn always, on the LQ / GT batch (draw on the host included).
- *optimizers*: ``step()`` on SPAN's parameters and on a 4 M-parameter set, as ns per parameter.

All cases are timed interleaved: every round runs each case once, in an order rotated by one per round, and the
median over rounds is reported, so a burst of load from other processes spreads over all cases instead of
hitting one. fp32; on CUDA when present (synchronised around each timed call), else the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from anysr.archs import build_network
from anysr.data.batch_augment import BatchAugment
from anysr.errors import OptionError
from anysr.losses.perceptual import vgg19_stand_in
from anysr.metrics.dists import DISTS
from anysr.metrics.lpips import LPIPS
from anysr.models import optimizers as _optimizers  # noqa: F401 - fills OPTIMIZER_REGISTRY
from anysr.ops.augment import AUGMENTS
from anysr.registry import LOSS_REGISTRY, OPTIMIZER_REGISTRY

Case = Callable[[], object]


def build_loss(spec: dict[str, object]) -> nn.Module:
    """The registered loss ``spec['type']`` with the other keys as arguments (state dicts included)."""
    kwargs = dict(spec)
    return LOSS_REGISTRY.get(str(kwargs.pop("type")))(**kwargs)


def interleaved(cases: dict[str, Case], rounds: int, sync: Callable[[], None]) -> dict[str, float]:
    """Median milliseconds of each case over ``rounds`` rounds, every round running each case once."""
    names = list(cases)
    for name in names:  # warm-up (allocator, kernels, lazy imports)
        cases[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter()
            cases[name]()
            sync()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {n: statistics.median(t) for n, t in times.items()}


def loss_cases(batch: int, gt: int, device: torch.device) -> dict[str, Case]:
    """Forward + backward of each loss on a (batch, 3, gt, gt) output."""
    g = torch.Generator().manual_seed(0)
    target = torch.rand(batch, 3, gt, gt, generator=g).to(device)
    pred = (target + 0.05 * torch.randn(batch, 3, gt, gt, generator=g).to(device)).clamp(0, 1).requires_grad_(True)
    ema = (target + 0.03 * torch.randn(batch, 3, gt, gt, generator=g).to(device)).clamp(0, 1)
    three = [0.0448, 0.2856, 0.3001]
    vgg = vgg19_stand_in()
    specs: dict[str, dict[str, object]] = {
        "L1Loss": {"type": "L1Loss"}, "MSELoss": {"type": "MSELoss"}, "CharbonnierLoss": {"type": "CharbonnierLoss"},
        "HuberLoss": {"type": "HuberLoss"},
        "SSIMLoss": {"type": "SSIMLoss"}, "MSSSIMLoss (3 scales)": {"type": "MSSSIMLoss", "weights": three},
        "MSSSIML1Loss (3 scales)": {"type": "MSSSIML1Loss", "weights": three},
        "SobelLoss": {"type": "SobelLoss"}, "GradientVarianceLoss": {"type": "GradientVarianceLoss"},
        "LumaLoss": {"type": "LumaLoss"}, "ChromaLoss": {"type": "ChromaLoss"}, "OklabLoss": {"type": "OklabLoss"},
        "FFTLoss": {"type": "FFTLoss"}, "FFLoss": {"type": "FFLoss"},
        "PerceptualLoss (VGG19 to conv5_4)": {"type": "PerceptualLoss", "vgg_state_dict": vgg, "layer_weights": {
            "conv1_2": 0.1, "conv2_2": 0.1, "conv3_4": 1.0, "conv4_4": 1.0, "conv5_4": 1.0}},
        "ContextualLoss (VGG19 conv4_4)": {"type": "ContextualLoss", "vgg_state_dict": vgg},
        "LPIPSLoss alex": {"type": "LPIPSLoss", "net": "alex",
                           "weight_state_dicts": [LPIPS(net="alex").state_dict()]},
        "LPIPSLoss vgg": {"type": "LPIPSLoss", "net": "vgg", "weight_state_dicts": [LPIPS(net="vgg").state_dict()]},
        "DISTSLoss": {"type": "DISTSLoss", "weight_state_dicts": [DISTS().state_dict()]},
        # traiNNer-redux's own
        "ColorLoss": {"type": "ColorLoss"}, "AverageLoss": {"type": "AverageLoss"},
        "BicubicLoss": {"type": "BicubicLoss"}, "CosimLoss": {"type": "CosimLoss"}, "NCCLoss": {"type": "NCCLoss"},
        "FLIPLoss": {"type": "FLIPLoss"},
        "StructureTextureLoss (VGG19 to conv5_4)": {"type": "StructureTextureLoss", "vgg_state_dict": vgg},
        "ADISTSLoss": {"type": "ADISTSLoss", "weight_state_dicts": [DISTS().state_dict()]},
        # neosr's own (under its type names)
        "mssim_loss": {"type": "mssim_loss"}, "consistency_loss": {"type": "consistency_loss"},
        "kl_loss": {"type": "kl_loss"}, "msswd_loss": {"type": "msswd_loss"}, "ff_loss": {"type": "ff_loss"},
        "ldl_loss": {"type": "ldl_loss"}, "chc_loss": {"type": "chc_loss"},
        "vgg_perceptual_loss (VGG19 to conv5_4)": {"type": "vgg_perceptual_loss", "vgg_state_dict": vgg},
        # (conv5_4's 4x4 map of a 64² crop is smaller than the x4 Patch Loss kernels: to conv4_4)
        "vgg_perceptual_loss + patchloss + ipk (x4, to conv4_4)": {
            "type": "vgg_perceptual_loss", "vgg_state_dict": vgg, "patchloss": True, "ipk": True, "scale": 4,
            "layer_weights": {"conv1_2": 0.1, "conv2_2": 0.1, "conv3_4": 1.0, "conv4_4": 1.0}},
        "dists_loss": {"type": "dists_loss", "weight_state_dicts": [DISTS().state_dict()]},
        "fdl_loss (model vgg)": {"type": "fdl_loss", "model": "vgg", "weight_state_dicts": [vgg]},
    }
    cases: dict[str, Case] = {}

    def make(loss: nn.Module, *extra: torch.Tensor) -> Case:
        def run() -> None:
            pred.grad = None
            out = loss(pred, *extra)
            total = sum(o for o in out if o is not None) if isinstance(out, tuple) else out
            total.backward()
        return run

    for name, spec in specs.items():
        loss = build_loss(spec).to(device)
        if hasattr(loss, "at_iteration"):  # msswd_loss: its draws are keyed by (seed, iteration, call)
            loss.at_iteration(0, 0)
        cases[name] = make(loss, target)
    cases["LDLLoss"] = make(build_loss({"type": "LDLLoss"}).to(device), ema, target)
    net_d = build_network({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 64,
                           "skip_connection": True}).to(device)
    gan = build_loss({"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.1}).to(device)

    def gan_g() -> None:
        pred.grad = None
        gan(net_d(pred), True, is_disc=False).backward()

    def gan_d() -> None:
        net_d.zero_grad(set_to_none=True)
        (gan(net_d(target), True, is_disc=True) + gan(net_d(pred.detach()), False, is_disc=True)).backward()

    cases["GANLoss, G side (UNetDiscriminatorSN 64)"] = gan_g
    cases["GAN: discriminator update (real + fake)"] = gan_d
    return cases


def augment_cases(batch: int, gt: int, device: torch.device) -> dict[str, Case]:
    g = torch.Generator().manual_seed(1)
    data = {"lq": torch.rand(batch, 3, gt // 4, gt // 4, generator=g).to(device),
            "gt": torch.rand(batch, 3, gt, gt, generator=g).to(device)}
    cases: dict[str, Case] = {}
    for kind in AUGMENTS[1:]:
        aug = BatchAugment((kind,), (1.0,), seed=0)
        counter = iter(range(10**9))
        cases[f"{kind}"] = lambda aug=aug, counter=counter: aug(data, next(counter), 0, 0)
    return cases


OPTIMIZERS = [("SGD", {"lr": 1e-3, "momentum": 0.9}), ("Adam", {"lr": 1e-4}), ("AdamW", {"lr": 1e-4}),
              ("AdamWScheduleFree", {"lr": 1e-4}), ("Lion", {"lr": 1e-5}), ("ADOPT", {"lr": 1e-4}),
              ("Prodigy", {"lr": 1.0}), ("AdanScheduleFree", {"lr": 1e-3, "warmup_steps": 100}),
              ("adan_sf", {"lr": 1e-3, "schedule_free": True, "warmup_steps": 100}),
              ("adamw_sf", {"lr": 1e-4, "schedule_free": True}), ("adamw_win", {"lr": 1e-4}),
              ("NeosrAdan", {"lr": 1e-4})]


def optimizer_cases(params_by_set: dict[str, list[nn.Parameter]]) -> tuple[dict[str, Case], dict[str, int]]:
    cases: dict[str, Case] = {}
    counts = {}
    for set_name, params in params_by_set.items():
        counts[set_name] = sum(p.numel() for p in params)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        for name, kwargs in OPTIMIZERS:
            try:
                cls = OPTIMIZER_REGISTRY.get(name)
            except OptionError:  # the optional package is not installed
                continue
            opt = cls(params, **kwargs)
            if hasattr(opt, "train"):
                opt.train()
            cases[f"{name}|{set_name}"] = opt.step
    return cases, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--gt", type=int, default=64, help="GT crop side (LQ: gt / 4)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1,
                    help="1 by default: on a shared, loaded CPU, 2 threads wait on each other (10-60x slower)")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables (markdown) here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    load_before = os.getloadavg()
    started = time.perf_counter()

    span = build_network({"type": "SPAN", "num_in_ch": 3, "num_out_ch": 3, "feature_channels": 48,
                          "upscale": 4}).to(device)
    g = torch.Generator().manual_seed(2)
    lq = torch.rand(args.batch, 3, args.gt // 4, args.gt // 4, generator=g).to(device)
    hr = torch.rand(args.batch, 3, args.gt, args.gt, generator=g).to(device)
    step_opt = torch.optim.AdamW(span.parameters(), lr=1e-4)
    l1 = nn.L1Loss()

    def train_step() -> None:
        step_opt.zero_grad(set_to_none=True)
        l1(span(lq), hr).backward()
        step_opt.step()

    losses = loss_cases(args.batch, args.gt, device)
    augs = augment_cases(args.batch, args.gt, device)
    big = [nn.Parameter(torch.randn(64, 64, 3, 3, device=device)) for _ in range(108)]  # 3.98 M parameters
    spare = [nn.Parameter(p.detach().clone()) for p in span.parameters()]
    optims, counts = optimizer_cases({"SPAN x4 48": spare, "4 M": big})
    ms = interleaved({"step": train_step, **{f"loss|{k}": v for k, v in losses.items()},
                      **{f"aug|{k}": v for k, v in augs.items()}}, args.rounds, sync)
    ms.update(interleaved(optims, args.rounds * 2, sync))
    step = ms["step"]
    load_after = os.getloadavg()

    where = (f"{torch.cuda.get_device_name()}" if device.type == "cuda"
             else f"CPU ({torch.backends.cpu.get_cpu_capability()} kernels)")
    lines = [
        f"Device: {where}; torch {torch.__version__}; {torch.get_num_threads()} threads; fp32; "
        f"{datetime.date.today().isoformat()}; 1-minute load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; {args.rounds} interleaved rounds ({time.perf_counter() - started:.0f} s).",
        "",
        f"Training step of SPAN x4 (48 channels, {sum(p.numel() for p in span.parameters()) / 1e6:.2f} M "
        f"parameters), batch {args.batch}, LQ {args.gt // 4}² -> GT {args.gt}², L1 + AdamW: **{step:.1f} ms**.",
        "",
        f"| loss (forward + backward on {args.batch} x 3 x {args.gt}²) | ms | share of the step |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k[5:]} | {v:.2f} | {100 * v / step:.1f} % |" for k, v in ms.items() if k.startswith("loss|")]
    lines += ["", f"| batch augmentation (LQ {args.gt // 4}², GT {args.gt}², batch {args.batch}) | ms | share of "
              "the step |", "|---|---:|---:|"]
    lines += [f"| {k[4:]} | {v:.3f} | {100 * v / step:.2f} % |" for k, v in ms.items() if k.startswith("aug|")]
    sets = list(counts)
    lines += ["", "| optimizer step() | " + " | ".join(f"{s} ({counts[s] / 1e6:.2f} M): ms, ns / param"
                                                      for s in sets) + " |",
              "|---|" + "---:|" * len(sets)]
    for name, _ in OPTIMIZERS:
        cells = [f"{ms[f'{name}|{s}']:.2f} ms, {1e6 * ms[f'{name}|{s}'] / counts[s]:.2f}" for s in sets
                 if f"{name}|{s}" in ms]
        if cells:
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
