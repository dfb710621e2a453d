"""neosr's ``fdl_loss`` (anysr's FrequencyDistributionLoss): values and gradients equal to neosr's source on its four
backbones (fixtures from ``tools/fixtures/make_neosr_fdl_fixtures.py``: torchvision's vgg19 / resnet101 /
efficientnet_b7 and DINOv2's official ViT-B/14 with the same seeded random weights on both sides, never stored; the
same random projections), anysr's DINOv2 features equal to DINOv2's source and to timm's, the weights file taken as
the engine takes it (``weights``; not set: one line naming the option and the file), bad arguments refused by name,
a ``train.losses`` entry trained through the command line, and XLA:CPU (``-m xla``).

Tolerances. The loss sorts projections of the spectra's phases, whose gradient is 1 / |coefficient| and whose value
jumps by 2 pi across the negative real axis: neosr's own fp32 gradient is off its fp64 one by up to 3.6e-2 of the
largest entry (``neosr_fp32_vs_fp64`` in the manifest). So the tight check is in fp64 against neosr run in fp64 with
exact-arithmetic spectra (``exact_real_bins``: the imaginary parts that are exactly 0 for real input set to 0, as
anysr's DFT gives them): value rtol 1e-6, gradient 1e-3 of the largest entry (measured: values <= 1.5e-7, gradients
<= 3.8e-5, the CNNs <= 5.1e-8; DINOv2's resized position embedding is fp32 on both sides). In fp32 against neosr's
plain fp32 output: value rtol 1e-4, or 3x neosr's own fp32 error where that is larger (vgg_opts 1.9e-4, effnet
8.2e-4; measured: anysr's fp32 value is within 1e-6 of the exact one except vgg_default, 7.4e-8 ... 3.4e-5), gradient
within 2x neosr's own fp32 deviation, 1e-3 at least (measured 3e-4 ... 3.5e-2, each at neosr's own deviation).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, saved_weights, write_options
from test_trainner_dialect import dialect, valid

from anysr.losses import build_loss
from anysr.losses.dinov2 import DINOv2, dinov2_config
from anysr.losses.fdl import FrequencyDistributionLoss, spectrum
from anysr.models.loss_set import LossSpec, loss_weight_needs
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "neosr_fdl"
from seeded_weights import seeded_state_dict  # noqa: E402 - tools/fixtures (tests/conftest.py)

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = {c["name"]: c for c in MANIFEST["cases"]}
_STAGES = tuple(f"features.{i}." for i in range(6))
_KEEP = {  # the entries each backbone reads (the full torchvision files work too; the rest is ignored)
    "vgg": lambda k: k.startswith("features."),
    "resnet": lambda k: not k.startswith("layer4."),
    "effnet": lambda k: k.startswith((*_STAGES, "classifier.")),
    "dinov2": lambda k: True,
}


def _backbone(case: dict) -> str:
    return str(case["options"].get("model", "dinov2")).lower()


@functools.cache
def _weights(name: str) -> dict[str, torch.Tensor]:
    shapes = MANIFEST["shapes"][name]
    return seeded_state_dict(shapes, MANIFEST["seeds"][name], [k for k in shapes if _KEEP[name](k)])


def _images(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    n, c, h, w = case["shape"]
    g = torch.Generator().manual_seed(case["input_seed"])
    pred = torch.rand(n, c, h, w, generator=g)
    target = (pred * 0.7 + 0.3 * torch.rand(n, c, h, w, generator=g)).clamp(0, 1)
    assert abs(pred.sum().item() - case["pred_sum"]) < 1e-3 * pred.numel() ** 0.5
    return pred, target


def _run(loss: torch.nn.Module, pred: torch.Tensor, target: torch.Tensor,
         dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    p = pred.to(dtype).requires_grad_(True)
    value = loss.to(dtype)(p, target.to(dtype))
    (grad,) = torch.autograd.grad(value, p)
    return value.detach().double(), grad.double()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradient_match_neosr(name: str) -> None:
    case = CASES[name]
    ref = torch.load(FIXTURES / case["file"])
    loss = build_loss({"type": "fdl_loss", **case["options"], "weight_state_dicts": [_weights(_backbone(case))]},
                      "t")
    assert isinstance(loss, FrequencyDistributionLoss)
    pred, target = _images(case)
    own = case["neosr_fp32_vs_fp64"]
    value, grad = _run(loss, pred, target, torch.float32)
    torch.testing.assert_close(value, ref["value32"].double(), rtol=max(1e-4, 3 * own["value"]), atol=0)
    assert _rel(grad, ref["grad32"]) <= max(1e-3, 2 * own["gradient"]), _rel(grad, ref["grad32"])
    value, grad = _run(loss, pred, target, torch.float64)
    torch.testing.assert_close(value, ref["value64x"].double(), rtol=1e-6, atol=0)
    assert _rel(grad, ref["grad64x"]) <= 1e-3, _rel(grad, ref["grad64x"])


@pytest.mark.parametrize("case", MANIFEST["timm"], ids=[c["name"] for c in MANIFEST["timm"]])
def test_dinov2_features_equal_dinov2_and_timm(case: dict) -> None:
    sd = seeded_state_dict(case["shapes"], case["seed"])
    cfg = dinov2_config(sd)
    net = DINOv2(**cfg)
    net.load_state_dict(sd, strict=True)
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.rand(*case["shape"], generator=g)
    assert abs(x.sum().item() - case["x_sum"]) < 1e-2
    ref = torch.load(FIXTURES / case["file"])
    with torch.no_grad():
        out = net.intermediate_layers(x, case["layers"])
    for mine, official, timm in zip(out, ref["official"], ref["timm"], strict=True):
        assert mine.shape == official.shape
        torch.testing.assert_close(mine, official, rtol=1e-5, atol=1e-5 * float(official.abs().max()))
        torch.testing.assert_close(mine, timm, rtol=1e-5, atol=1e-5 * float(timm.abs().max()))


def test_spectrum_equals_torch_fft() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 9, generator=g, dtype=torch.float64)
    x[0, 0] = 0  # a zero map: magnitude 0, phase 0, zero gradients
    f = torch.fft.fftn(x, dim=(-2, -1))
    mag, phase = spectrum(x)
    torch.testing.assert_close(mag, f.abs(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.remainder(phase - f.angle() + torch.pi, 2 * torch.pi) - torch.pi,
                               torch.zeros_like(phase), rtol=0, atol=1e-10)
    assert float(phase[1, 0, 0, 0]) in (0.0, torch.pi)  # a real coefficient: 0 or +pi, never -pi
    xr = x.clone().requires_grad_(True)
    m, p = spectrum(xr)
    (m.sum() + p.sum()).backward()
    assert torch.isfinite(xr.grad).all() and float(xr.grad[0, 0].abs().max()) == 0.0


def _tiny_dinov2(depth: int = 2, regs: int = 0) -> dict[str, torch.Tensor]:
    shapes = {"cls_token": [1, 1, 64], "pos_embed": [1, 17, 64], "mask_token": [1, 64],
              "patch_embed.proj.weight": [64, 3, 14, 14], "patch_embed.proj.bias": [64],
              "norm.weight": [64], "norm.bias": [64]}
    if regs:
        shapes["register_tokens"] = [1, regs, 64]
    for i in range(depth):
        b = f"blocks.{i}."
        shapes.update({b + "norm1.weight": [64], b + "norm1.bias": [64], b + "attn.qkv.weight": [192, 64],
                       b + "attn.qkv.bias": [192], b + "attn.proj.weight": [64, 64], b + "attn.proj.bias": [64],
                       b + "ls1.gamma": [64], b + "norm2.weight": [64], b + "norm2.bias": [64],
                       b + "mlp.fc1.weight": [128, 64], b + "mlp.fc1.bias": [128], b + "mlp.fc2.weight": [64, 128],
                       b + "mlp.fc2.bias": [64], b + "ls2.gamma": [64]})
    return seeded_state_dict(shapes, 3)


def test_projections_are_seeded_and_the_names_find_the_class() -> None:
    assert LOSS_REGISTRY.get("fdl_loss") is FrequencyDistributionLoss
    assert LOSS_REGISTRY.get("FrequencyDistributionLoss") is FrequencyDistributionLoss
    opts = {"dino_layers": [0, 1], "dino_weights": [1.0, 0.5], "weight_state_dicts": [_tiny_dinov2()]}
    a, b = FrequencyDistributionLoss(**opts), FrequencyDistributionLoss(**opts, loss_weight=2.0)
    assert torch.equal(a.rand_0, b.rand_0) and torch.equal(a.rand_1, b.rand_1)
    assert a.rand_0.shape == (24, 64, 4, 4) and torch.allclose(a.rand_0.flatten(1).norm(dim=1), torch.ones(24))
    assert "rand_0" not in a.state_dict()
    x = torch.rand(1, 3, 60, 57)
    torch.testing.assert_close(b(x, x.flip(-1)), 2 * a(x, x.flip(-1)))
    assert a.net.training is False and not any(p.requires_grad for p in a.parameters())


@pytest.mark.parametrize(("opts", "pattern"), [
    ({"model": "alexnet"}, "model must be one of"),
    ({"patch_size": 0}, "patch_size"),
    ({"stride": 1.5}, "stride"),
    ({"dino_layers": [0, 2]}, "dino_layers"),
    ({"dino_layers": [0, 0], "dino_weights": [1, 1]}, "dino_layers"),
    ({"dino_layers": [0, 1]}, "dino_weights"),
])
def test_bad_arguments_are_refused_by_name(opts: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        FrequencyDistributionLoss(**opts, weight_state_dicts=[_tiny_dinov2()])


def test_missing_or_wrong_weights_and_small_maps_are_refused() -> None:
    with pytest.raises(ValueError, match=r"dinov2_vitb14.*`weights`"):
        FrequencyDistributionLoss()
    with pytest.raises(ValueError, match="resnet101"):
        FrequencyDistributionLoss(model="resnet")
    with pytest.raises(ValueError, match="not a DINOv2 hub state dict"):
        FrequencyDistributionLoss(weight_state_dicts=[{"features.0.weight": torch.zeros(1)}])
    loss = FrequencyDistributionLoss(dino_layers=[0], dino_weights=[1.0], weight_state_dicts=[_tiny_dinov2()])
    with pytest.raises(ValueError, match="smaller than patch_size 4"):
        loss(torch.rand(1, 3, 30, 30), torch.rand(1, 3, 30, 30))
    for model, file in (("vgg", "vgg19-dcbb9e9d"), ("effnet", "efficientnet_b7"), ("dinov2", "dinov2_vitb14")):
        spec = LossSpec("fdl", "train.losses[1]", {"type": "fdl_loss", "model": model}, "learned")
        (need,) = loss_weight_needs([spec], {})
        assert need.option == "train.losses[1].weights" and file in need.missing and "\n" not in need.missing


def test_register_model_and_fp32_under_autocast() -> None:
    loss = FrequencyDistributionLoss(dino_layers=[1], dino_weights=[1.0], weight_state_dicts=[_tiny_dinov2(regs=4)])
    x = torch.rand(1, 3, 61, 50, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(x, x.detach().flip(-2))
    assert value.dtype == torch.float32 and torch.isfinite(value)
    value.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------- options and the command line

def _options(tmp_path: Path, **changes: object) -> dict:
    weights = tmp_path / "dinov2_tiny.pth"
    torch.save(_tiny_dinov2(), weights)
    losses = [{"type": "charbonnierloss", "loss_weight": 1.0},
              {"type": "fdl_loss", "loss_weight": 0.5, "weights": str(weights), "dino_layers": [0, 1],
               "dino_weights": [1.0, 0.5], "patch_size": 2, "num_proj": 8}]
    return dialect(**{"name": "neosrfdl", "train__losses": losses, "val__val_enabled": False, **changes})


def test_train_losses_entry_validates(tmp_path: Path) -> None:
    entry = valid(_options(tmp_path))["train"]["losses"][1]
    assert entry["type"] == "FrequencyDistributionLoss" and entry["weights"] == [str(tmp_path / "dinov2_tiny.pth")]


@pytest.mark.slow
def test_fdl_loss_trains_through_the_cli(tmp_path: Path) -> None:
    path = write_options(tmp_path / "neosrfdl.yml", _options(
        tmp_path, train__total_iter=2, logger__print_freq=1, logger__save_checkpoint_freq=2))
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_frequencydistribution", "l_charbonnier"):
        assert name in log, (name, log[-3000:])
    g = saved_weights(tmp_path / "experiments" / "neosrfdl", 2)
    assert all(torch.isfinite(v).all() for v in g.values() if v.is_floating_point())


# ----------------------------------------------------------------------------- XLA

@pytest.mark.xla
@pytest.mark.parametrize("model", ["dinov2", "resnet_patch2", "effnet_patch2"])
def test_xla_compiles_once_without_cpu_fallbacks(model: str) -> None:
    """Forward + backward on an XLA:CPU device, three steps: one graph, no aten op on the CPU, the eager CPU run's
    value and gradient."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    dev = torch_xla.device()
    if model == "dinov2":
        loss = FrequencyDistributionLoss(dino_layers=[0, 1], dino_weights=[1.0, 0.5], dino_norm=True,
                                         weight_state_dicts=[_tiny_dinov2(regs=0)])
        g = torch.Generator().manual_seed(1)
        x = torch.rand(2, 3, 61, 50, generator=g)
        y = (x * 0.8 + 0.2 * torch.rand(2, 3, 61, 50, generator=g)).clamp(0, 1)
    else:
        case = CASES[model]
        weights = _weights(_backbone(case))
        loss = build_loss({"type": "fdl_loss", **case["options"], "weight_state_dicts": [weights]}, "t")
        x, y = _images(case)
    cpu_value, cpu_grad = _run(loss, x, y, torch.float32)
    loss = loss.to(dev)
    torch_xla.sync()
    metrics.clear_all()
    compiles = []
    for _ in range(3):
        pred = x.to(dev).requires_grad_(True)
        value = loss(pred, y.to(dev))
        (grad,) = torch.autograd.grad(value, pred)
        torch_xla.sync()
        data = metrics.metric_data("CompileTime")
        compiles.append(int(data[0]) if data else 0)
    assert compiles[0] >= 1 and compiles[1] == compiles[2] == compiles[0], f"recompiled: {compiles}"
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    assert not fallbacks, fallbacks
    torch.testing.assert_close(value.cpu().double(), cpu_value, rtol=1e-4, atol=0)
    assert _rel(grad.cpu(), cpu_grad) <= 1e-3, _rel(grad.cpu(), cpu_grad)  # measured <= 2.2e-5
