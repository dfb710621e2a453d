"""traiNNer-redux's FLIPLoss (NVIDIA's LDR-FLIP) and ADISTSLoss (A-DISTS on VGG16) under its names.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_trainner_losses_b_fixtures.py``): loss
values and gradients w.r.t. the prediction on odd-sized images. A-DISTS' VGG16 has random weights drawn from a
seeded generator on both sides (``vgg16_random``), so no weight file is stored. Also: names, arguments, weight
files, bf16 autocast, a ``train.losses`` entry that validates, a traiNNer-style file trained through the command
line with both losses, and XLA:CPU (``-m xla``, in the XLA venv).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import FIXTURE_TOOLS, ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file
from test_trainner_dialect import dialect, valid

from anysr.errors import CheckpointError
from anysr.losses import build_loss
from anysr.losses.adists import ADISTS, ADISTSLoss
from anysr.losses.flip import FLIPLoss
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "trainner_losses_b"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
DATA = load_file(str(FIXTURES / "losses.safetensors"))
_spec = importlib.util.spec_from_file_location("make_trainner_losses_b_fixtures",
                                               FIXTURE_TOOLS / "make_trainner_losses_b_fixtures.py")
_make = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(_make)  # type: ignore[union-attr]
VGG = _make.vgg16_random(MANIFEST["vgg_seed"])

# FLIP computes the same operations (observed: equal values, gradients within 5e-9 of a 1e-2 scale). A-DISTS is
# 1 - d with d near 1 from separable rather than 2-D windows: observed 1.2e-7 absolute on the value (float32's
# step at 1), gradients within 1.7e-8 of a 6e-4 scale.
LOSS_TOL = {"FLIPLoss": {"rtol": 1e-5, "atol": 1e-7}, "ADISTSLoss": {"rtol": 0.0, "atol": 1e-6}}
GRAD_RTOL = 1e-4  # elementwise, plus an absolute share of the gradient's largest magnitude:
# 1e-4, A-DISTS 1e-3 (its VGG16 and windowed statistics on AVX2 kernels: 2.2e-4 of the largest entry, measured)
GRAD_ATOL_REL = {"FLIPLoss": 1e-4, "ADISTSLoss": 1e-3}


def _loss(type_name: str, **kwargs: object) -> torch.nn.Module:
    if type_name.lower() == "adistsloss":
        kwargs["weight_state_dicts"] = [VGG]
    return build_loss({"type": type_name.lower(), **kwargs}, "train.losses[0]")


def _images(k: int, spread: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = DATA[f"x{k}"].float() / 255, DATA[f"y{k}"].float() / 255
    return x * (1 + 2 * spread) - spread, y


@pytest.mark.parametrize(("case", "k"), [(c, k) for c in sorted(CASES) for k in CASES[c]["images"]])
def test_loss_and_gradient_match_trainner(case: str, k: int) -> None:
    spec = CASES[case]
    loss = _loss(spec["type"], **spec["kwargs"])
    x, y = _images(k, spec["spread"])
    pred = x.clone().requires_grad_(True)
    value = loss(pred, y)
    torch.testing.assert_close(value.detach().reshape(1), DATA[f"{case}.{k}.loss"], **LOSS_TOL[spec["type"]],
                               msg=f"{case} image {k}")
    if spec["grad"]:
        value.backward()
        want = DATA[f"{case}.{k}.grad"]
        torch.testing.assert_close(pred.grad, want, rtol=GRAD_RTOL,
                                   atol=GRAD_ATOL_REL[spec["type"]] * want.abs().max().item())


@pytest.mark.parametrize(("name", "cls"), [("fliploss", FLIPLoss), ("adistsloss", ADISTSLoss)])
def test_lower_case_names_find_the_losses_and_loss_weight_scales(name: str, cls: type) -> None:
    assert LOSS_REGISTRY.get(name) is cls
    x, y = _images(1)
    one = _loss(name)(x, y)
    torch.testing.assert_close(_loss(name, loss_weight=0.25)(x, y), one * 0.25)
    assert _loss(name)(y, y).abs() < 0.05 * one  # equal images: about 0 (FLIP: its eps floor, 2e-3)


@pytest.mark.parametrize("name", ["fliploss", "adistsloss"])
def test_fp32_under_autocast_and_finite_gradients(name: str) -> None:
    x, y = _images(0, spread=0.02)
    loss = _loss(name)
    pred = x.clone().requires_grad_(True)
    value = loss(pred, y)
    value.backward()
    assert torch.isfinite(value) and pred.grad is not None and torch.isfinite(pred.grad).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = loss(x.bfloat16(), y.bfloat16())
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, loss(x.bfloat16().float(), y.bfloat16().float()))


def test_flip_filters_follow_pixels_per_degree() -> None:
    default = FLIPLoss()
    assert default.csf.shape == (3, 1, 21, 21) and default.features.shape == (4, 1, 19, 19)
    torch.testing.assert_close(default.csf.sum(dim=(1, 2, 3)), torch.ones(3))
    edge = default.features[0, 0]
    assert edge[edge > 0].sum().item() == pytest.approx(1) and edge[edge < 0].sum().item() == pytest.approx(-1)
    assert FLIPLoss(pixels_per_degree=30).csf.shape[-1] == 11
    # green against blue, Hunt-adjusted HyAB ** 0.7: a plain float made once (nothing read back from a device)
    assert isinstance(default.cmax, float) and default.cmax == pytest.approx(41.2761, abs=1e-3)


def test_adists_loads_dists_style_weights_and_refuses_partial_ones() -> None:
    own = ADISTS().load_weights(VGG).state_dict()
    extra = {**own, "alpha": torch.ones(1, 1475, 1, 1), "beta": torch.ones(1, 1475, 1, 1),
             "windows.0": torch.ones(3, 1, 21, 21)}  # DISTS' head and traiNNer-redux's windows: skipped
    again = ADISTS().load_weights(extra)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in own.items())
    partial = {k: v for k, v in VGG.items() if not k.startswith("features.28.")}
    with pytest.raises(CheckpointError, match="missing stage5.28.bias, stage5.28.weight"):
        ADISTS().load_weights(partial)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "fliploss", "pixels_per_degree": 0}, "pixels_per_degree"),
    ({"type": "fliploss", "pixels_per_degree": "far"}, "pixels_per_degree"),
    ({"type": "adistsloss", "window_size": 20, "weight_state_dicts": [VGG]}, "window_size"),
    ({"type": "adistsloss"}, "weight_state_dicts"),
])
def test_bad_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_loss(opt, "x")


def _options(tmp_path: Path, **changes: object) -> dict:
    vgg = tmp_path / "vgg16.pth"
    if not vgg.exists():
        torch.save(VGG, vgg)
    losses = [{"type": "charbonnierloss", "loss_weight": 1.0}, {"type": "fliploss", "loss_weight": 0.5},
              {"type": "adistsloss", "loss_weight": 0.25, "weights": [str(vgg)]}]
    return dialect(**{"name": "lossb", "train__losses": losses, "val__val_enabled": False, **changes})


def test_train_losses_entries_validate(tmp_path: Path) -> None:
    losses = valid(_options(tmp_path))["train"]["losses"]
    flip, adists = losses[1], losses[2]
    assert flip["type"] == "FLIPLoss" and flip["pixels_per_degree"] == pytest.approx(67.02, abs=0.01)
    assert adists["type"] == "ADISTSLoss" and adists["window_size"] == 21 and adists["weights"] == [
        str(tmp_path / "vgg16.pth")]


def test_adists_weights_are_the_named_files_else_the_standard_vgg16() -> None:
    from anysr.models.loss_set import LossSpec, build_losses, loss_weight_needs  # noqa: PLC0415

    spec = LossSpec("adists", "train.losses[2]", {"type": "ADISTSLoss", "loss_weight": 1.0}, "learned")
    store: dict = {}
    (need,) = loss_weight_needs([spec], store)
    assert need.known == "vgg16" and need.path is None and need.option == "train.losses[2].weights"
    named = LossSpec("adists", "train.losses[2]", {"type": "ADISTSLoss", "weights": ["/w/vgg16.pth"]}, "learned")
    (need,) = loss_weight_needs([named], store)
    assert need.path == "/w/vgg16.pth" and need.known is None
    need.apply(VGG, None)  # what the engine does with the file it read
    built = build_losses([named], store, torch.device("cpu"))["adists"]
    assert isinstance(built, ADISTSLoss) and torch.equal(built.metric.stage1[0].weight, VGG["features.0.weight"])


def test_train_losses_entry_names_a_missing_weights_file(tmp_path: Path) -> None:
    from anysr.errors import OptionError  # noqa: PLC0415

    opt = _options(tmp_path)
    opt["train"]["losses"][2]["weights"] = [str(tmp_path / "absent.pth")]
    with pytest.raises(OptionError, match=r"train\.losses\[2\]\.weights\[0\]"):
        valid(opt)


@pytest.mark.slow
def test_trainner_file_with_flip_and_adists_trains_through_the_cli(tmp_path: Path) -> None:
    path = write_options(tmp_path / "lossb.yml", _options(tmp_path, train__total_iter=2,
                                                          logger__print_freq=1, logger__save_checkpoint_freq=2))
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_flip", "l_adists", "l_charbonnier"):
        assert name in log, (name, log[-3000:])
    g = saved_weights(tmp_path / "experiments" / "lossb", 2)
    assert all(torch.isfinite(v).all() for v in g.values() if v.is_floating_point())


# ----------------------------------------------------------------------------- XLA

@pytest.mark.xla
def test_xla_losses_compile_once_without_cpu_fallbacks() -> None:
    """Forward + backward of both losses on an XLA:CPU device, three steps: one graph, no aten op on the CPU,
    the values of the eager CPU run."""
    import os  # noqa: PLC0415

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    dev = torch_xla.device()
    x, y = _images(0, spread=0.02)
    losses = [_loss("fliploss"), _loss("adistsloss", window_size=9)]
    want = []
    for loss in losses:
        pred = x.clone().requires_grad_(True)
        value = loss(pred, y)
        value.backward()
        want.append((value.detach(), pred.grad))
    losses = [loss.to(dev) for loss in losses]
    xd, yd = x.to(dev), y.to(dev)
    torch_xla.sync()
    metrics.clear_all()
    compiles, got = [], []
    for _ in range(3):
        pred = xd.clone().requires_grad_(True)
        values = [loss(pred, yd) for loss in losses]
        grads = torch.autograd.grad(values[0] + values[1], pred)[0]
        torch_xla.sync()
        data = metrics.metric_data("CompileTime")
        compiles.append(int(data[0]) if data else 0)
        got = [v.cpu() for v in values] + [grads.cpu()]
    assert compiles[0] >= 1 and compiles[1] == compiles[2], f"recompiled: {compiles}"
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    assert not fallbacks, f"ops fell back to the CPU: {fallbacks}"
    torch.testing.assert_close(got[0], want[0][0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], want[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2], want[0][1] + want[1][1], rtol=1e-3, atol=1e-3 * got[2].abs().max().item())
