"""neosr's ``vgg_perceptual_loss`` (VGGPerceptualLoss, with its Patch Loss), ``dists_loss`` (RawDISTSLoss) and its
validation metrics (``calculate_psnr`` / ``calculate_ssim`` / ``calculate_dists``) against neosr's own source.

Fixtures come from ``tools/fixtures/make_neosr_perceptual_fixtures.py``: loss values and gradients w.r.t. the
prediction on odd-sized images, and neosr's metric values on two real pairs cut from Set5. The VGG19 / VGG16 and
DISTS' alpha / beta are random, drawn from seeded generators on both sides (the make script's functions), so no
weight file is stored. Also: names, arguments, the patch terms' missing gradient, autocast, ``train.losses`` /
``val.metrics`` entries that validate, a training run through the command line with both losses, and XLA:CPU
(``-m xla``, in the XLA venv).
"""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOOLS, ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file
from test_trainner_dialect import dialect, valid

from anysr.losses import build_loss
from anysr.losses.neosr_perceptual import RawDISTSLoss, VGGPerceptualLoss
from anysr.metrics import DISTS, calculate_psnr, calculate_ssim, psnr_torch, ssim_torch
from anysr.metrics.raw_dists import RawDISTS
from anysr.metrics.topiq import TOPIQ
from anysr.registry import LOSS_REGISTRY, METRIC_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "neosr_perceptual"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
IMAGES = load_file(str(FIXTURES / "images.safetensors"))
_spec = importlib.util.spec_from_file_location("make_neosr_perceptual_fixtures",
                                               FIXTURE_TOOLS / "make_neosr_perceptual_fixtures.py")
_make = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(_make)  # type: ignore[union-attr]
VGG19 = _make.vgg19_random(MANIFEST["vgg19_seed"])
VGG16 = _make.vgg16_random(MANIFEST["vgg16_seed"])
HEAD = _make.dists_head(MANIFEST["head_seed"])

VALUE_RTOL = 1e-5
# of the gradient's largest magnitude (plus rtol 1e-4 elementwise): within 1e-4 with the kernels the fixtures were
# made with (AVX-512); AVX2 kernels move VGG's features enough to flip a few ReLUs: 3.4e-4 measured there (chc on the
# close pair, Patch Loss x4), 7.5e-3 where the loss reads relu layers directly (relu_range_norm)
GRAD_ATOL_REL = 1e-3
GRAD_ATOL_REL_CASE = {"relu_range_norm": 2e-2}
METRIC_RTOL = 1e-6


_BUILT: dict[str, torch.nn.Module] = {}


def _loss(type_name: str, **kwargs: object) -> torch.nn.Module:
    """The loss with the fixtures' random weights; built once per set of arguments (the losses hold no state)."""
    key = f"{type_name} {json.dumps(kwargs, sort_keys=True)}"
    if key not in _BUILT:
        weights = {"weight_state_dicts": [VGG16, HEAD]} if type_name.lower() == "dists_loss" else {
            "vgg_state_dict": VGG19}
        _BUILT[key] = build_loss({"type": type_name, **kwargs, **weights}, "train.losses[0]")
    return _BUILT[key]


def _images(k: int, spread: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = IMAGES[f"x{k}"].float() / 255, IMAGES[f"y{k}"].float() / 255
    return x * (1 + 2 * spread) - spread, y


def _case_loss(spec: dict) -> torch.nn.Module:
    kwargs = dict(spec["kwargs"])
    if "scale" in spec:
        kwargs["scale"] = spec["scale"]
    return _loss(spec["type"], **kwargs)


@pytest.mark.parametrize(("case", "k"), [(c, k) for c in sorted(CASES) for k in CASES[c]["images"]])
def test_loss_and_gradient_match_neosr(case: str, k: int) -> None:
    spec = CASES[case]
    data = load_file(str(FIXTURES / f"{case}.safetensors"))
    x, y = _images(k, spec["spread"])
    pred = x.clone().requires_grad_(True)
    value = _case_loss(spec)(pred, y)
    torch.testing.assert_close(value.detach().reshape(1), data[f"{k}.loss"], rtol=VALUE_RTOL, atol=0,
                               msg=f"{case} image {k}")
    if spec["grad"]:
        value.backward()
        want = data[f"{k}.grad"]
        tol = GRAD_ATOL_REL_CASE.get(case, GRAD_ATOL_REL)
        torch.testing.assert_close(pred.grad, want, rtol=1e-4, atol=tol * want.abs().max().item())


def test_clipped_case_clips_some_feature_gaps_but_not_all() -> None:
    """chc's clamp at 1 matters in ``chc_clipped`` (else that case would not test it)."""
    loss = _loss("vgg_perceptual_loss")
    x, y = _images(0, CASES["chc_clipped"]["spread"])
    fx, fy = loss.vgg(x), loss.vgg(y)
    gaps = torch.cat([((fx[k] - fy[k]) * 0.1).abs().flatten() for k in loss.layer_weights])
    share = (gaps > 1).float().mean().item()
    assert 0.05 < share < 0.95, share


@pytest.mark.parametrize(("name", "cls"), [("vgg_perceptual_loss", VGGPerceptualLoss),
                                           ("dists_loss", RawDISTSLoss)])
def test_neosr_names_find_the_losses_and_loss_weight_scales(name: str, cls: type) -> None:
    assert LOSS_REGISTRY.get(name) is cls and cls.role == "learned"
    x, y = _images(0)
    one = _loss(name)(x, y)
    torch.testing.assert_close(_loss(name, loss_weight=0.25)(x, y), one * 0.25)
    assert _loss(name)(y, y).abs() < 1e-3 * one.abs() + 1e-6  # equal images: 0


def test_patch_terms_add_to_the_value_but_not_to_the_gradient() -> None:
    x, y = _images(1)
    plain = _loss("vgg_perceptual_loss", layer_weights={"conv1_2": 1.0, "conv3_4": 0.5})
    patched = _loss("vgg_perceptual_loss", layer_weights={"conv1_2": 1.0, "conv3_4": 0.5}, patchloss=True,
                    ipk=True, scale=4)
    grads, values = [], []
    for loss in (plain, patched):
        pred = x.clone().requires_grad_(True)
        value = loss(pred, y)
        value.backward()
        values.append(value.detach())
        grads.append(pred.grad)
    assert values[1] > values[0]
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    assert not any(k.startswith("eye") for k in patched.state_dict())  # the patch kernels are not saved


@pytest.mark.parametrize("name", ["vgg_perceptual_loss", "dists_loss"])
def test_fp32_under_autocast_and_finite_gradients(name: str) -> None:
    x, y = _images(0, spread=0.02)
    loss = _loss(name)
    pred = x.clone().requires_grad_(True)
    value = loss(pred, y)
    value.backward()
    assert torch.isfinite(value) and pred.grad is not None and torch.isfinite(pred.grad).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = loss(x.bfloat16(), y.bfloat16())
    assert mixed.dtype == torch.float32 and torch.isfinite(mixed)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "vgg_perceptual_loss", "criterion": "fro"}, "criterion"),
    ({"type": "vgg_perceptual_loss", "ipk": True}, "ipk"),
    ({"type": "vgg_perceptual_loss", "patchloss": True}, "scale"),
    ({"type": "vgg_perceptual_loss", "patchloss": True, "scale": 3}, "scale"),
    ({"type": "vgg_perceptual_loss", "layer_weights": {"conv6_1": 1.0}}, "layer_weights"),
    ({"type": "dists_loss", "as_loss": False}, "as_loss"),
    ({"type": "dists_loss", "load_weights": False}, "load_weights"),
])
def test_bad_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        _loss(str(opt.pop("type")), **opt)


def test_missing_weights_and_too_small_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="vgg_state_dict"):
        build_loss({"type": "vgg_perceptual_loss"}, "x")
    with pytest.raises(ValueError, match="weight_state_dicts"):
        build_loss({"type": "dists_loss"}, "x")
    loss = _loss("vgg_perceptual_loss", patchloss=True, scale=4)  # conv4_4 of a 37x41 image: 4x5 < 8x8
    with pytest.raises(ValueError, match="smaller than its 8x8 patch kernel"):
        loss(*_images(0))


# ----------------------------------------------------------------------------- validation metrics

def _pair(k: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 BGR HWC, as neosr's validation hands images to its metrics."""
    return cv2.imread(str(FIXTURES / f"sr{k}.png")), cv2.imread(str(FIXTURES / f"gt{k}.png"))


def _tensor(img: np.ndarray) -> torch.Tensor:
    """RGB NCHW on [0, 1], as anysr's validation measures."""
    return torch.from_numpy(np.ascontiguousarray(img[..., ::-1].transpose(2, 0, 1))).float().unsqueeze(0) / 255


# neosr metric type + options -> anysr's (crop_border: neosr's default is 4 whatever the scale; anysr's the scale)
def _anysr_opts(kwargs: dict) -> dict:
    return {"crop_border": kwargs.get("crop_border", 4), "test_y_channel": kwargs.get("test_y_channel", False)}


@pytest.mark.parametrize("name", [n for n in MANIFEST["metrics"] if n != "dists"])
def test_psnr_and_ssim_equal_neosr_on_set5_pairs(name: str) -> None:
    spec = MANIFEST["metrics"][name]
    numpy_fn, torch_fn = ((calculate_psnr, psnr_torch) if spec["type"] == "calculate_psnr"
                          else (calculate_ssim, ssim_torch))
    assert METRIC_REGISTRY.get(spec["type"]) is numpy_fn  # neosr's names are BasicSR's, which anysr registers
    opts = _anysr_opts(spec["kwargs"])
    for k, want in enumerate(spec["values"]):
        sr, gt = _pair(k)
        assert numpy_fn(sr, gt, **opts) == pytest.approx(want, rel=METRIC_RTOL, abs=0), (name, k)
        got = torch_fn(_tensor(sr), _tensor(gt), **opts)  # what val.metrics runs on the device
        assert float(got) == pytest.approx(want, rel=METRIC_RTOL, abs=0), (name, k)


def test_raw_dists_equals_neosr_calculate_dists_and_dists_does_not() -> None:
    raw = RawDISTS().load_weights(VGG16, HEAD)
    paper = DISTS().load_weights(VGG16, HEAD)
    assert METRIC_REGISTRY.get("raw_dists") is RawDISTS and METRIC_REGISTRY.get("calculate_raw_dists") is RawDISTS
    for k, want in enumerate(MANIFEST["metrics"]["dists"]["values"]):
        x, y = (_tensor(i) for i in _pair(k))
        with torch.no_grad():
            assert float(raw(x, y)) == pytest.approx(want, rel=METRIC_RTOL, abs=1e-8), k
            if k == 0:  # ImageNet normalisation: other values
                assert abs(float(paper(x, y)) - want) > 10 * METRIC_RTOL * want


def test_val_metrics_entries_validate_and_build_raw_dists(tmp_path: Path) -> None:
    from anysr.engine.evaluation.val_metrics import ValMetrics, build_metric_module  # noqa: PLC0415
    from anysr.metrics.info import METRIC_INFOS, metric_info  # noqa: PLC0415

    vgg, head = tmp_path / "vgg16.pth", tmp_path / "dists_weights.pth"
    torch.save(VGG16, vgg)
    torch.save(HEAD, head)
    metrics = {"psnr": {"type": "calculate_psnr", "crop_border": 4, "test_y_channel": True},
               "ssim": {"type": "calculate_ssim", "crop_border": 4},
               "dists": {"type": "raw_dists", "crop_border": 0, "weights": [str(vgg), str(head)]}}  # neosr: no crop
    opt = valid(dialect(val__metrics=metrics))
    got = opt["val"]["metrics"]
    assert got["dists"]["better"] == "lower" and got["psnr"]["better"] == "higher"
    assert metric_info("calculate_raw_dists") is METRIC_INFOS["raw_dists"]
    module = build_metric_module(METRIC_INFOS["raw_dists"], [vgg, head])
    assert isinstance(module, RawDISTS) and torch.equal(module.alpha, HEAD["alpha"])
    # what validation computes for the first Set5 pair: neosr's numbers
    val = ValMetrics(got, types.SimpleNamespace(device=torch.device("cpu")))
    val.start()
    sr, gt = (_tensor(i) for i in _pair(0))
    val.update(sr, gt, torch.zeros(1), [False], ["sr0.png"], "set5")
    values = {key: float(v[0]) for key, v in val.per_image().items()}
    want = MANIFEST["metrics"]
    assert values["psnr"] == pytest.approx(want["psnr_y"]["values"][0], rel=METRIC_RTOL)
    assert values["ssim"] == pytest.approx(want["ssim"]["values"][0], rel=METRIC_RTOL)
    assert values["dists"] == pytest.approx(want["dists"]["values"][0], rel=METRIC_RTOL, abs=1e-8)


TOPIQ_FIX = json.loads((FIXTURES / "topiq.json").read_text())
TOPIQ_RTOL = 1e-5  # a ResNet-50 and four attention stages (measured 6e-7, torch 2.9 against 2.13)


def _topiq_weights() -> dict[str, torch.Tensor]:
    shapes = {k: tuple(v.shape) for k, v in TOPIQ().state_dict().items()}
    assert sorted(shapes) == TOPIQ_FIX["keys"]  # neosr's (IQA-PyTorch's) state-dict keys, one for one
    sd = _make.topiq_random(shapes, TOPIQ_FIX["seed"])
    assert float(sum(v.double().sum() for v in sd.values())) == pytest.approx(TOPIQ_FIX["checksum"], rel=1e-12)
    return sd


def test_topiq_equals_neosr_calculate_topiq(monkeypatch: pytest.MonkeyPatch) -> None:
    from anysr.engine.evaluation import val_metrics  # noqa: PLC0415

    sd = _topiq_weights()
    model = TOPIQ().load_weights({"params": sd})  # IQA-PyTorch's file layout
    assert METRIC_REGISTRY.get("calculate_topiq") is TOPIQ
    pairs = [tuple(_tensor(i) for i in _pair(k)) for k in range(len(TOPIQ_FIX["values"]))]
    with torch.no_grad():
        got = model(torch.cat([p[0] for p in pairs[:1]]), torch.cat([p[1] for p in pairs[:1]]))
        assert float(got[0]) == pytest.approx(TOPIQ_FIX["values"][0], rel=TOPIQ_RTOL)
        assert float(model(*pairs[1])[0]) == pytest.approx(TOPIQ_FIX["values"][1], rel=TOPIQ_RTOL)
    # in val.metrics: the user's file (read as the engine reads it), no crop (neosr's calculate_topiq has none)
    dummy = FIXTURES / "gt0.png"  # validation only checks that the file exists; its reading is replaced below
    metrics = {"topiq": {"type": "calculate_topiq", "crop_border": 0, "weights": str(dummy)}}
    got_opt = valid(dialect(val__metrics=metrics))["val"]["metrics"]
    assert got_opt["topiq"]["better"] == "higher"
    monkeypatch.setattr(val_metrics, "read_metric_weights", lambda files, where: [{"params": sd}])
    val = val_metrics.ValMetrics(got_opt, types.SimpleNamespace(device=torch.device("cpu")))
    val.start()
    val.update(*pairs[1], torch.zeros(1), [False], ["sr1.png"], "set5")
    assert float(val.per_image()["topiq"][0]) == pytest.approx(TOPIQ_FIX["values"][1], rel=TOPIQ_RTOL)


def test_topiq_needs_the_users_weight_file() -> None:
    from anysr.engine.evaluation.val_metrics import build_metric_module  # noqa: PLC0415
    from anysr.errors import OptionError  # noqa: PLC0415
    from anysr.metrics.info import METRIC_INFOS  # noqa: PLC0415

    with pytest.raises(OptionError, match=r"val\.metrics\.topiq\.weights.*cfanet_fr_kadid_res50"):
        valid(dialect(val__metrics={"topiq": {"type": "topiq", "crop_border": 0}}))
    with pytest.raises(OptionError, match="needs its weight file cfanet_fr_kadid_res50-2c4cc61d.pth"):
        build_metric_module(METRIC_INFOS["topiq"], [], where="val.metrics.topiq")


# ----------------------------------------------------------------------------- options and the command line

def _options(tmp_path: Path, **changes: object) -> dict:
    vgg19 = tmp_path / "vgg19.pth"  # the layers up to conv2_2 are all the loss reads
    torch.save({k: v for k, v in VGG19.items() if int(k.split(".")[1]) <= 7}, vgg19)
    vgg16, head = tmp_path / "vgg16.pth", tmp_path / "dists_weights.pth"
    torch.save(VGG16, vgg16)
    torch.save(HEAD, head)
    losses = [{"type": "charbonnierloss", "loss_weight": 1.0},
              {"type": "vgg_perceptual_loss", "loss_weight": 0.5, "vgg_weights_path": str(vgg19),
               "layer_weights": {"conv1_2": 0.1, "conv2_2": 1.0}, "patchloss": True, "ipk": True, "scale": 2},
              {"type": "dists_loss", "loss_weight": 0.25, "weights": [str(vgg16), str(head)]}]
    return dialect(**{"name": "neosrpercep", "train__losses": losses, "val__val_enabled": False, **changes})


def test_train_losses_entries_validate(tmp_path: Path) -> None:
    losses = valid(_options(tmp_path))["train"]["losses"]
    percep, dists = losses[1], losses[2]
    assert percep["type"] == "VGGPerceptualLoss" and percep["criterion"] == "chc" and percep["scale"] == 2
    assert dists["type"] == "RawDISTSLoss" and dists["weights"] == [str(tmp_path / "vgg16.pth"),
                                                                    str(tmp_path / "dists_weights.pth")]


def test_dists_loss_reads_the_standard_files_when_none_are_named() -> None:
    from anysr.models.loss_set import LossSpec, loss_weight_needs  # noqa: PLC0415

    spec = LossSpec("dists", "train.losses[2]", {"type": "RawDISTSLoss", "loss_weight": 1.0}, "learned")
    needs = loss_weight_needs([spec], {})
    assert [n.known for n in needs] == ["vgg16", "dists"]
    percep = LossSpec("vgg", "train.losses[1]", {"type": "VGGPerceptualLoss"}, "learned")
    (need,) = loss_weight_needs([percep], {})
    assert need.known == "vgg19" and need.option == "train.losses[1].vgg_weights_path"


@pytest.mark.slow
def test_file_with_both_losses_trains_through_the_cli(tmp_path: Path) -> None:
    path = write_options(tmp_path / "neosrpercep.yml", _options(
        tmp_path, train__total_iter=2, logger__print_freq=1, logger__save_checkpoint_freq=2))
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_vggperceptual", "l_rawdists", "l_charbonnier"):  # the traiNNer dialect names them by class
        assert name in log, (name, log[-3000:])
    g = saved_weights(tmp_path / "experiments" / "neosrpercep", 2)
    assert all(torch.isfinite(v).all() for v in g.values() if v.is_floating_point())


# ----------------------------------------------------------------------------- XLA

@pytest.mark.xla
def test_xla_losses_compile_once_without_cpu_fallbacks() -> None:
    """Forward + backward of both losses (the perceptual one with its Patch Loss and IPK) on an XLA:CPU device,
    three steps: one graph, no aten op on the CPU, the values of the eager CPU run."""
    import os  # noqa: PLC0415

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    dev = torch_xla.device()
    x, y = _images(1, spread=0.02)
    losses = [_loss("vgg_perceptual_loss", layer_weights={"conv1_2": 0.1, "conv3_4": 1.0}, patchloss=True,
                    ipk=True, scale=4), _loss("dists_loss")]
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


@pytest.mark.xla
def test_xla_topiq_compiles_once_without_cpu_fallbacks() -> None:
    """TOPIQ's forward on an XLA:CPU device, three times: one graph, no aten op on the CPU, the eager value."""
    import os  # noqa: PLC0415

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    dev = torch_xla.device()
    model = TOPIQ().load_weights(_topiq_weights())
    x, y = (_tensor(i)[..., :70, :76] for i in _pair(1))
    with torch.no_grad():
        want = model(x, y)
        model = model.to(dev)
        xd, yd = x.to(dev), y.to(dev)
        torch_xla.sync()
        metrics.clear_all()
        compiles, got = [], None
        for _ in range(3):
            got = model(xd, yd)
            torch_xla.sync()
            data = metrics.metric_data("CompileTime")
            compiles.append(int(data[0]) if data else 0)
    assert compiles[0] >= 1 and compiles[1] == compiles[2], f"recompiled: {compiles}"
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    assert not fallbacks, f"ops fell back to the CPU: {fallbacks}"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def test_eval_scores_folders_with_raw_dists_and_topiq(tmp_path: Path) -> None:
    """`anysr eval --metrics raw_dists,topiq` (the folder evaluator): neosr's numbers for the two Set5 pairs, the
    weights from --dists-weights / --topiq-weights files; TOPIQ without its file is one line naming the flag."""
    from anysr.engine.evaluation.folder_eval import evaluate_folders  # noqa: PLC0415
    from anysr.errors import OptionError  # noqa: PLC0415

    gt_dir, sr_dir = tmp_path / "gt", tmp_path / "sr"
    gt_dir.mkdir()
    sr_dir.mkdir()
    for k in range(2):
        sr, gt = _pair(k)
        cv2.imwrite(str(sr_dir / f"im{k}.png"), sr)
        cv2.imwrite(str(gt_dir / f"im{k}.png"), gt)
    vgg, head, topiq = tmp_path / "vgg16.pth", tmp_path / "dists_weights.pth", tmp_path / "topiq.pth"
    torch.save(VGG16, vgg)
    torch.save(HEAD, head)
    torch.save({"params": _topiq_weights()}, topiq)
    report = evaluate_folders(gt_dir, sr_dir, 1, crop_border=0, metrics=["raw_dists", "topiq"],
                              weights={"dists": [vgg, head], "topiq": [topiq]})
    rows = sorted(report["images"], key=lambda r: r["name"])
    want = MANIFEST["metrics"]["dists"]["values"]
    assert [r["raw_dists"] for r in rows] == pytest.approx(want, rel=METRIC_RTOL, abs=1e-8)
    assert [r["topiq"] for r in rows] == pytest.approx(TOPIQ_FIX["values"], rel=TOPIQ_RTOL)
    with pytest.raises(OptionError, match="--topiq-weights.*cfanet_fr_kadid_res50"):
        evaluate_folders(gt_dir, sr_dir, 1, crop_border=0, metrics=["topiq"])
