"""neosr's small losses under its type names (mssim_loss, consistency_loss, kl_loss, msswd_loss, ncc_loss, ff_loss,
ldl_loss, chc_loss, gan_loss) and its L1Loss / MSELoss / HuberLoss: values and gradients equal to its source's
(fixtures from ``tools/fixtures/make_neosr_losses_a_fixtures.py``; msswd_loss with the reference's own random
projections), msswd's keyed draws (resume and ranks), bad arguments refused by name, a ``train.losses`` list
trained through the command line, and XLA:CPU (``-m xla``: forward + backward compile once, no CPU fallback).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file
from test_gan import gan_options
from test_trainner_dialect import dialect, valid

from anysr.losses import build_loss
from anysr.models.loss_set import LossSpec
from anysr.models.sr import SRModel
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "neosr_losses_a"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
IMAGES = load_file(str(FIXTURES / "images.safetensors"))
# Values: rtol 1e-5, atol 2e-7 (mssim_loss on the close pair is 1 - 0.99997: float32's spacing at 1 is 6e-8, so
# its value carries ~1e-7 absolute rounding whatever the summation order). Gradients: rtol 1e-4 with atol 1e-4 of
# the largest entry (entries near 0 carry summation-order noise).
VALUE_TOL = {"rtol": 1e-5, "atol": 2e-7}
GRAD_RTOL, GRAD_ATOL_REL = 1e-4, 1e-4
# consistency_loss with its default criterion chc and the blur: the pseudo-Huber's gradient d / sqrt(d^2 + 1e-12)
# turns from -1 to 1 within |d| < 1e-6, and the blurred L* of prediction and target agree that closely at some
# pixels, so the blur's float32 rounding (anysr: two 21-tap passes; torchvision: one 21 x 21 conv) moves those
# pixels' gradients by O(1) of their size: 5e-3 of the largest entry (measured 2.7e-3 on the close pair, 8e-5 on
# the far one; the same cases with criterion l1, or without the blur, agree to 5e-7).
CHC_BLUR_GRAD_ATOL_REL = 5e-3
# mssim_loss: on the close pair (MS-SSIM 0.99997) the gradient comes from variances E[x^2] - mu^2 of 0.004 noise,
# float32 cancellation in the filtered maps: 5e-4 of the largest entry (measured 1.1e-4; 3.6e-6 on the far pair).
MSSIM_GRAD_ATOL_REL = 5e-4
CLASSES = {"mssim_loss": "PaddedMSSSIMLoss", "consistency_loss": "ConsistencyLoss", "kl_loss": "KLDivergenceLoss",
           "msswd_loss": "MSSWDLoss", "ncc_loss": "NCCLoss", "ff_loss": "FocalFrequencyLoss",
           "ldl_loss": "ArtifactWeightedLoss", "chc_loss": "CHCLoss", "gan_loss": "LabelledGANLoss",
           "L1Loss": "L1Loss", "MSELoss": "MSELoss", "HuberLoss": "HuberLoss"}
IMAGE_CASES = sorted(c for c, s in CASES.items() if s["type"] != "gan_loss")
GAN_CASES = sorted(c for c, s in CASES.items() if s["type"] == "gan_loss")


def _data(type_name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / f"{type_name.lower()}.safetensors"))


def _pair(k: int, crop: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = IMAGES[f"x{k}"].float() / 255, IMAGES[f"y{k}"].float() / 255
    if crop:
        x, y = x[..., : crop[0], : crop[1]], y[..., : crop[0], : crop[1]]
    return x.contiguous(), y.contiguous()


def _close_grad(got: torch.Tensor | None, want: torch.Tensor, atol_rel: float = GRAD_ATOL_REL) -> None:
    assert got is not None
    torch.testing.assert_close(got, want, rtol=GRAD_RTOL, atol=atol_rel * float(want.abs().max()))


def _grad_atol_rel(spec: dict[str, Any]) -> float:
    kw = spec["kwargs"]
    chc_blur = spec["type"] == "consistency_loss" and kw.get("criterion", "chc") == "chc" and kw.get("blur", True)
    if spec["type"] == "mssim_loss":
        return MSSIM_GRAD_ATOL_REL
    return CHC_BLUR_GRAD_ATOL_REL if chc_blur else GRAD_ATOL_REL


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_neosr_type_names_find_the_classes(name: str) -> None:
    cls = LOSS_REGISTRY.get(name)
    assert cls.__name__ == CLASSES[name]
    assert getattr(cls, "role", "pixel") == ("gan" if name == "gan_loss" else "pixel")


@pytest.mark.parametrize("case", IMAGE_CASES)
def test_loss_and_gradient_match_neosr(case: str) -> None:
    spec = CASES[case]
    data = _data(spec["type"])
    loss = build_loss({"type": spec["type"], **spec["kwargs"]}, "train.losses[0]")
    for k in spec["images"]:
        x, y = _pair(k, spec.get("crop"))
        x.requires_grad_(True)
        extra = {"projections": data[f"{case}.{k}.proj"]} if spec["type"] == "msswd_loss" else {}
        value = loss(x, y, **extra)
        value.backward()
        torch.testing.assert_close(value.detach().reshape(1), data[f"{case}.{k}.loss"], **VALUE_TOL)
        _close_grad(x.grad, data[f"{case}.{k}.grad"], _grad_atol_rel(spec))


@pytest.mark.parametrize("case", GAN_CASES)
def test_gan_loss_matches_neosr(case: str) -> None:
    spec = CASES[case]
    data = _data("gan_loss")
    loss = build_loss({"type": "gan_loss", **spec["kwargs"]}, "train.gan_opt")
    for j, (real, disc) in enumerate(spec["calls"]):
        x = IMAGES["logits"].clone().requires_grad_(True)
        value = loss(x, real, is_disc=disc)
        value.backward()
        torch.testing.assert_close(value.detach().reshape(1), data[f"{case}.{j}.loss"], **VALUE_TOL)
        _close_grad(x.grad, data[f"{case}.{j}.grad"])


def test_consistency_fixtures_cover_both_sides_of_the_cosine_threshold() -> None:
    d = _data("consistency_loss")
    with_cos, without = float(d["consistency.1.loss"]), float(d["consistency_nocosim.1.loss"])
    assert 0 < with_cos - without < 1e-3  # the close pair: the cosine term is added
    loss = build_loss({"type": "consistency_loss", "cosim": False}, "x")
    x, y = _pair(0)
    torch.testing.assert_close(loss(x, y).reshape(1), d["consistency.0.loss"], **VALUE_TOL)  # far: not added


def test_msswd_draws_are_keyed_by_seed_iteration_and_call() -> None:
    x, y = _pair(0)
    a = build_loss({"type": "msswd_loss"}, "x")
    a.at_iteration(7, seed=3)
    torch.manual_seed(0)
    first, second = a(x, y), a(x, y)  # two micro-batches of iteration 7: calls 0 and 1
    assert not torch.equal(first, second)
    b = build_loss({"type": "msswd_loss"}, "x")  # a resumed run (fresh module), another global RNG state
    torch.manual_seed(123)
    b.at_iteration(7, seed=3)
    assert torch.equal(b(x, y), first) and torch.equal(b(x, y), second)
    b.at_iteration(8, seed=3)
    assert b.calls == 0 and not torch.equal(b(x, y), first)
    b.at_iteration(7, seed=4)
    assert not torch.equal(b(x, y), first)
    c = build_loss({"type": "msswd_loss"}, "x")
    c.at_iteration(7, seed=3)
    torch.testing.assert_close(c(x, y, projections=a.projections(3, 7, 0)), first, rtol=0, atol=0)
    proj = a.projections(3, 7, 0)
    assert proj.shape == (24, 3, 11, 11)
    torch.testing.assert_close(proj.flatten(1).norm(dim=1), torch.ones(24))


def test_loss_terms_key_the_draws_by_iteration_and_manual_seed() -> None:
    loss = build_loss({"type": "msswd_loss"}, "x")
    model = SimpleNamespace(loss_specs=[LossSpec("msswd", "train.losses[0]", {"type": "MSSWDLoss"}, "pixel")],
                            losses={"msswd": loss}, loss_prefix="l_", current_iter=11, opt={"manual_seed": 5})
    x, y = _pair(1)
    got = SRModel.loss_terms(model, x, x, lambda role: y)  # type: ignore[arg-type]
    assert (loss.seed, loss.iteration, loss.calls) == (5, 11, 1)
    torch.testing.assert_close(got["l_msswd"], loss(x, y, projections=loss.projections(5, 11, 0)), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mssim_loss", "consistency_loss", "kl_loss", "msswd_loss", "ncc_loss", "ff_loss",
                                  "ldl_loss", "chc_loss"])
def test_weight_and_autocast(name: str) -> None:
    x, y = _pair(0)
    loss = build_loss({"type": name}, "x")
    extra = {"projections": loss.projections(0, 0, 0)} if name == "msswd_loss" else {}
    one = loss(x, y, **extra)
    torch.testing.assert_close(build_loss({"type": name, "loss_weight": 0.25}, "x")(x, y, **extra), one * 0.25)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = loss(x.bfloat16(), y.bfloat16(), **extra)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, loss(x.bfloat16().float(), y.bfloat16().float(), **extra))


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "mssim_loss", "window_size": 10}, "window_size"),
    ({"type": "mssim_loss", "sigma": 0}, "sigma"),
    ({"type": "mssim_loss", "padding": -1}, "padding"),
    ({"type": "mssim_loss", "in_channels": 0}, "in_channels"),
    ({"type": "consistency_loss", "criterion": "huber"}, "criterion"),
    ({"type": "msswd_loss", "c": 1}, "c must"),
    ({"type": "msswd_loss", "num_proj": 0}, "num_proj"),
    ({"type": "msswd_loss", "stride": 1.5}, "stride"),
    ({"type": "ff_loss", "patch_factor": 0}, "patch_factor"),
    ({"type": "ldl_loss", "criterion": "l3"}, "criterion"),
    ({"type": "ldl_loss", "ksize": 4}, "ksize"),
    ({"type": "chc_loss", "criterion": "l2"}, "criterion"),
    ({"type": "chc_loss", "reduction": "max"}, "reduction"),
    ({"type": "gan_loss", "gan_type": "vanilla"}, "gan_type"),
])
def test_bad_arguments_are_refused_by_name(opt: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as err:
        build_loss(opt, "x")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("opt", "shape"), [
    ({"type": "mssim_loss"}, (1, 1, 40, 40)), ({"type": "mssim_loss", "padding": 0}, (1, 3, 100, 100)),
    ({"type": "consistency_loss"}, (1, 1, 40, 40)), ({"type": "consistency_loss"}, (1, 3, 9, 40)),
    ({"type": "msswd_loss"}, (1, 3, 16, 16)), ({"type": "ldl_loss"}, (1, 3, 3, 20)),
])
def test_unfit_images_are_refused(opt: dict, shape: tuple[int, ...]) -> None:
    x = torch.rand(shape)
    with pytest.raises(ValueError, match="images|channels"):
        build_loss(opt, "x")(x, x)


def _losses(mssim: bool = True) -> list[dict[str, Any]]:
    return [{"type": "chc_loss", "loss_weight": 1.0}, *([{"type": "mssim_loss", "loss_weight": 0.5}] if mssim else []),
            {"type": "consistency_loss", "loss_weight": 0.5}, {"type": "kl_loss", "loss_weight": 0.1},
            {"type": "msswd_loss", "loss_weight": 0.5, "num_scale": 2, "patch_size": 5},
            {"type": "ncc_loss", "loss_weight": 0.1}, {"type": "ff_loss", "loss_weight": 0.1},
            {"type": "ldl_loss", "loss_weight": 1.0, "criterion": "chc"}]


def test_neosr_losses_list_validates() -> None:
    opt = valid(dialect(train__losses=_losses()))
    assert [e["type"] for e in opt["train"]["losses"]] == ["CHCLoss", "PaddedMSSSIMLoss", "ConsistencyLoss",
                                                           "KLDivergenceLoss", "MSSWDLoss", "NCCLoss",
                                                           "FocalFrequencyLoss", "ArtifactWeightedLoss"]


@pytest.mark.slow
def test_neosr_losses_train_through_the_cli(tmp_path: Path) -> None:
    """mssim_loss is left out: on 48-pixel crops its coarsest scale (3 x 3) of an untrained SPAN's output can have a
    negative mean contrast-structure, whose fractional power is NaN (as in neosr, which does not clamp it)."""
    opt = dialect(name="neolossa", train__total_iter=3, val__val_enabled=False, logger__print_freq=1,
                  logger__save_checkpoint_freq=3, train_set__lq_size=24, train__losses=_losses(mssim=False))
    path = write_options(tmp_path / "neolossa.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert "NaN" not in log, log[-3000:]
    for name in ("l_chc:", "l_consistency:", "l_kldivergence:", "l_msswd:", "l_ncc:", "l_focalfrequency:",
                 "l_artifactweighted:"):
        assert name in log, (name, log[-3000:])
    weights = saved_weights(tmp_path / "experiments" / "neolossa", 3)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


@pytest.mark.slow
def test_neosr_gan_loss_trains_a_gan_through_the_cli(tmp_path: Path, small_train_dir: Path) -> None:
    opt = gan_options("neogan", small_train_dir, None, model_type="SRGANModel", total_iter=2)
    train = opt["train"]
    for key in ("pixel_opt", "perceptual_opt", "gan_opt"):
        train.pop(key, None)
    train["losses"] = [{"type": "chc_loss", "loss_weight": 1.0},
                       {"type": "gan_loss", "gan_type": "huber", "real_label_val": 0.9, "loss_weight": 0.1}]
    path = write_options(tmp_path / "neogan.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_g_chc:", "l_g_labelledgan:", "l_d_real:", "l_d_fake:"):
        assert name in log, (name, log[-3000:])


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize(("name", "extra"), [
    ("mssim_loss", {}), ("consistency_loss", {}), ("consistency_loss", {"criterion": "l1", "blur": False}),
    ("kl_loss", {}), ("msswd_loss", {}), ("ncc_loss", {}), ("ff_loss", {}),
    ("ff_loss", {"patch_factor": 2, "ave_spectrum": False, "crop": (36, 40)}), ("ldl_loss", {"criterion": "huber"}),
    ("ldl_loss", {"criterion": "chc"}), ("chc_loss", {"loss_lambda": 0.5}), ("gan_loss", {"gan_type": "huber"}),
])
def test_xla_loss_compiles_once_without_fallback(name: str, extra: dict) -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    metrics.clear_all()
    dev = torch_xla.device()
    extra = dict(extra)
    # the far pair: on the close one L1 / sort / pseudo-Huber gradients flip on last-bit differences (XLA fuses
    # multiply-adds); chc's cosine term on the close one (the far pair has a black pixel: a zero colour vector)
    x, y = _pair(1 if name == "chc_loss" else 0, extra.pop("crop", None))

    def call(loss: torch.nn.Module, pred: torch.Tensor, target: torch.Tensor, it: int) -> torch.Tensor:
        if name == "gan_loss":
            return loss(pred, True, is_disc=False)
        if name == "msswd_loss":
            loss.at_iteration(it, seed=0)
        return loss(pred, target)

    cpu_pred = x.clone().requires_grad_(True)
    cpu_value = call(build_loss({"type": name, **extra}, "x"), cpu_pred, y, 1)
    cpu_value.backward()
    loss = build_loss({"type": name, **extra}, "x").to(dev)
    compiles = []
    for it in range(2):
        pred = x.to(dev).requires_grad_(True)
        value = call(loss, pred, y.to(dev), it + 1)
        value.backward()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
        if it == 0:
            torch.testing.assert_close(value.detach().cpu(), cpu_value.detach(), rtol=1e-4, atol=1e-6)
            assert cpu_pred.grad is not None and pred.grad is not None
            grad = pred.grad.cpu()
            torch.testing.assert_close(grad, cpu_pred.grad, rtol=1e-3, atol=1e-3 * float(cpu_pred.grad.abs().max()))
    assert compiles[1] == compiles[0], compiles
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks
