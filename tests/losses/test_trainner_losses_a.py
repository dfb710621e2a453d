"""traiNNer-redux's ColorLoss, AverageLoss, BicubicLoss, CosimLoss, NCCLoss and StructureTextureLoss under its
names: values and gradients equal to its source's (fixtures from ``tools/fixtures/make_trainner_losses_a_fixtures.py``;
StructureTextureLoss with the same random VGG19 weights on both sides), its lower-case names in a traiNNer-redux
``train.losses`` list (validated, and trained through the command line), bad arguments refused by name, and
XLA:CPU (``-m xla``: forward + backward compile once, no CPU fallback).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file
from test_trainner_dialect import dialect, valid

from anysr.errors import OptionError
from anysr.losses import build_loss
from anysr.losses.downscaled import bicubic_shrink
from anysr.losses.perceptual import vgg19_stand_in
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "trainner_losses_a"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
# Values: rtol 1e-5 (observed at most ~1e-6 relative: the same operations, other summation orders and kernels).
# Gradients: rtol 1e-4 with atol 1e-4 of the largest entry (entries near 0 carry the summation-order noise).
VALUE_TOL = {"rtol": 1e-5, "atol": 1e-7}
GRAD_RTOL, GRAD_ATOL_REL = 1e-4, 1e-4
NAMES = ["colorloss", "averageloss", "bicubicloss", "cosimloss", "nccloss", "structuretextureloss"]


def _vgg() -> dict[str, torch.Tensor]:
    if not hasattr(_vgg, "sd"):
        _vgg.sd = vgg19_stand_in(0)  # type: ignore[attr-defined]
    return _vgg.sd  # type: ignore[attr-defined]


def _build(type_name: str, **kwargs: Any) -> torch.nn.Module:
    opt: dict[str, Any] = {"type": type_name, **kwargs}
    if type_name.lower() == "structuretextureloss":
        opt["vgg_state_dict"] = _vgg()
    return build_loss(opt, "train.losses[0]")


def _data(type_name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / f"{type_name.lower()}.safetensors"))


def test_random_vgg_is_the_fixtures() -> None:
    total = sum(float(v.double().sum()) for v in _vgg().values())
    assert total == pytest.approx(MANIFEST["vgg_checksum"], rel=1e-9)


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_match_trainner(case: str) -> None:
    spec = CASES[case]
    data = _data(spec["type"])
    loss = _build(spec["type"].lower(), loss_weight=1.0, **spec["kwargs"])
    for k in spec["images"]:
        x = (data[f"x{k}"].float() / 255).requires_grad_(True)
        y = data[f"y{k}"].float() / 255
        value = loss(x, y)
        value.backward()
        torch.testing.assert_close(value.detach().reshape(1), data[f"{case}.{k}.loss"], **VALUE_TOL)
        want = data[f"{case}.{k}.grad"]
        assert x.grad is not None
        torch.testing.assert_close(x.grad, want, rtol=GRAD_RTOL, atol=GRAD_ATOL_REL * float(want.abs().max()))


def test_bicubic_shrink_is_torchs_antialiased_interpolate() -> None:
    x = torch.rand(2, 3, 29, 23, generator=torch.Generator().manual_seed(0))
    for scale in (2, 3, 4, 5):
        want = torch.nn.functional.interpolate(x, scale_factor=1 / scale, mode="bicubic", antialias=True)
        torch.testing.assert_close(bicubic_shrink(x, scale), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_lower_case_names_weight_and_autocast(name: str) -> None:
    cls = LOSS_REGISTRY.get(name)
    assert cls.__name__.lower() == name
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(2, 3, 24, 20, generator=gen), torch.rand(2, 3, 24, 20, generator=gen)
    extra = {"layer_weights": {"conv2_2": 1.0, "relu3_1": 0.5}} if name == "structuretextureloss" else {}
    loss = _build(name, loss_weight=1.0, **extra)
    one = loss(x, y)
    torch.testing.assert_close(_build(name, loss_weight=0.25, **extra)(x, y), one * 0.25)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = loss(x.bfloat16(), y.bfloat16())
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, loss(x.bfloat16().float(), y.bfloat16().float()))


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "colorloss", "criterion": "l3"}, "criterion"),
    ({"type": "averageloss", "criterion": "charbonnier"}, "criterion"),
    ({"type": "bicubicloss", "scale": 0}, "scale"),
    ({"type": "averageloss", "scale": 2.5}, "scale"),
    ({"type": "structuretextureloss", "color_space": "lab", "vgg_state_dict": {}}, "color_space"),
    ({"type": "structuretextureloss", "layer_weights": {"conv9_9": 1.0}, "vgg_state_dict": {}}, "layer_weights"),
    ({"type": "structuretextureloss"}, "vgg_weights_path"),
])
def test_bad_arguments_are_refused_by_name(opt: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_loss(opt, "x")


@pytest.mark.parametrize("name", ["colorloss", "structuretextureloss"])
def test_wrong_images_are_refused(name: str) -> None:
    gray = torch.rand(1, 1, 20, 20)
    with pytest.raises(ValueError, match="RGB"):
        _build(name)(gray, gray)


def _losses(vgg_file: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "colorloss", "loss_weight": 1.0, "criterion": "charbonnier", "scale": 2},
        {"type": "averageloss", "loss_weight": 0.5, "criterion": "l2", "scale": 4},
        {"type": "bicubicloss", "loss_weight": 0.5, "scale": 2},
        {"type": "cosimloss", "loss_weight": 0.1, "cosim_lambda": 5},
        {"type": "nccloss", "loss_weight": 0.1},
    ]
    if vgg_file is not None:
        out.append({"type": "structuretextureloss", "loss_weight": 0.1,
                    "layer_weights": {"conv1_2": 0.1, "conv2_2": 0.1}, "vgg_weights_path": vgg_file})
    return out


def test_trainner_losses_list_validates(tmp_path: Path) -> None:
    vgg = tmp_path / "vgg19.pth"
    vgg.touch()
    opt = valid(dialect(train__losses=_losses(str(vgg))))
    assert [e["type"] for e in opt["train"]["losses"]] == ["ColorLoss", "AverageLoss", "BicubicLoss", "CosimLoss",
                                                           "NCCLoss", "StructureTextureLoss"]
    with pytest.raises(OptionError, match="cosim_lambda"):
        valid(dialect(train__losses=[{"type": "nccloss", "loss_weight": 1.0, "cosim_lambda": 2}]))


@pytest.mark.slow
def test_trainner_losses_train_through_the_cli(tmp_path: Path) -> None:
    vgg = tmp_path / "vgg19.pth"
    torch.save({k: v for k, v in _vgg().items() if int(k.split(".")[1]) < 10}, vgg)  # conv2_2 is features.7
    opt = dialect(name="lossa", train__total_iter=3, val__val_enabled=False, logger__print_freq=1,
                  logger__save_checkpoint_freq=3, train__losses=_losses(str(vgg)))
    path = write_options(tmp_path / "lossa.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_color", "l_average", "l_bicubic", "l_cosim", "l_ncc", "l_structuretexture"):
        assert name in log, (name, log[-3000:])
    weights = saved_weights(tmp_path / "experiments" / "lossa", 3)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize(("name", "extra"), [
    ("colorloss", {"criterion": "charbonnier", "scale": 3}), ("averageloss", {}), ("bicubicloss", {}),
    ("bicubicloss", {"criterion": "l2", "scale": 3}), ("cosimloss", {}), ("nccloss", {}),
    ("structuretextureloss", {}), ("structuretextureloss", {"test_y_channel": False, "include_luminance": True}),
])
def test_xla_loss_compiles_once_without_fallback(name: str, extra: dict) -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    metrics.clear_all()
    dev = torch_xla.device()
    data = _data("StructureTextureLoss")
    x, y = data["x0"].float() / 255, data["y0"].float() / 255
    cpu_pred = x.clone().requires_grad_(True)
    cpu_value = _build(name, loss_weight=1.0, **extra)(cpu_pred, y)
    cpu_value.backward()
    loss = _build(name, loss_weight=1.0, **extra).to(dev)
    compiles = []
    for _ in range(2):
        pred = x.to(dev).requires_grad_(True)
        value = loss(pred, y.to(dev))
        value.backward()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
    assert compiles[1] == compiles[0], compiles
    torch.testing.assert_close(value.detach().cpu(), cpu_value.detach(), rtol=1e-4, atol=1e-5)
    assert cpu_pred.grad is not None and pred.grad is not None
    grad = pred.grad.cpu()
    torch.testing.assert_close(grad, cpu_pred.grad, rtol=1e-3, atol=1e-3 * float(cpu_pred.grad.abs().max()))
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks
