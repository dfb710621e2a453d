"""NIQE, LPIPS, DISTS and FID against their reference implementations (fixtures in tests/fixtures/metrics/).

The fixtures come from ``tools/fixtures/make_metric_fixtures.py`` (BasicSR 1.4.2, lpips, DISTS_pytorch,
pytorch-fid, scipy). The networks there had seeded random weights; ``seeded_state_dict`` (imported from that
script, numpy only) rebuilds exactly those weights here from the stored key -> shape lists, so no weight file
is stored or downloaded.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import re
from fnmatch import fnmatch
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.errors import CheckpointError, DataError, OptionError
from anysr.metrics import fid as fid_mod
from anysr.metrics.backbones import FIDInceptionV3, fid_inception_state_dict
from anysr.metrics.dists import DISTS
from anysr.metrics.fid import (
    calculate_fid,
    extract_features,
    feature_statistics,
    fid_from_features,
    folder_statistics,
    load_statistics,
    save_statistics,
    trace_sqrt_product,
)
from anysr.metrics.info import METRIC_INFOS, metric_info
from anysr.metrics.lpips import LPIPS
from anysr.metrics.niqe import calculate_niqe, pristine_params

FIX = ROOT / "tests" / "fixtures" / "metrics"
from make_metric_fixtures import seeded_state_dict  # noqa: E402 - tools/fixtures (tests/conftest.py)

MANIFEST = json.loads((FIX / "manifest.json").read_text())
NIQE_CASES = json.loads((FIX / "niqe.json").read_text())["cases"]
NIQE_TOL = 1e-3  # BasicSR's values; observed difference ~1e-13 (the float32 steps are reproduced)
FEATURE_TOL = {"rtol": 1e-4, "atol": 1e-4}  # Inception: ~100 layers of up to 2048 x 3 x 3 terms at 299 x 299
FID_REL_TOL = 1e-3

MODULES = ["niqe", "lpips", "dists", "fid", "backbones", "info"]


@functools.cache
def _seeded(*path: str) -> dict[str, torch.Tensor]:
    """The seeded weights whose shapes are at ``MANIFEST[path[0]][path[1]]`` (built once per session)."""
    return seeded_state_dict(MANIFEST[path[0]][path[1]])


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32) / 255.0


# ---------------------------------------------------------------------------------------------------- NIQE
@pytest.mark.parametrize("case", NIQE_CASES, ids=lambda c: f"{Path(c['image']).stem}-crop{c['crop_border']}-"
                                                             f"{c['convert_to']}")
def test_niqe_matches_basicsr(case: dict) -> None:
    img = cv2.imread(str(ROOT / case["image"]), cv2.IMREAD_UNCHANGED)
    got = calculate_niqe(img, case["crop_border"], input_order="HWC", convert_to=case["convert_to"])
    assert abs(got - case["niqe"]) <= NIQE_TOL, (got, case["niqe"])


def test_niqe_input_orders_and_grayscale() -> None:
    img = cv2.imread(str(ROOT / "datasets" / "Set5" / "HR" / "bird.png"), cv2.IMREAD_UNCHANGED)
    ref = calculate_niqe(img, 0)
    assert calculate_niqe(img.transpose(2, 0, 1), 0, input_order="CHW") == ref
    gray = cv2.imread(str(ROOT / "datasets" / "Set14" / "HR" / "bridge.png"), cv2.IMREAD_UNCHANGED)[:200, :300]
    assert gray.ndim == 2
    value = calculate_niqe(gray, 0)
    assert calculate_niqe(gray, 0, input_order="HW") == value
    assert calculate_niqe(gray[..., None], 0) == value
    assert 0 < value < 20


def test_niqe_errors_name_the_culprit() -> None:
    img = np.full((100, 300, 3), 128, np.uint8)
    with pytest.raises(DataError, match="96x96"):
        calculate_niqe(img[:, :150], 0)
    with pytest.raises(OptionError, match="input_order"):
        calculate_niqe(img, 0, input_order="WHC")
    with pytest.raises(OptionError, match="convert_to"):
        calculate_niqe(img, 0, convert_to="lab")
    with pytest.raises(DataError, match="crop_border"):
        calculate_niqe(img, 60)
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)
    assert math.isfinite(calculate_niqe(noisy, 0))


def test_niqe_pristine_parameters_ship_with_the_package() -> None:
    mu, cov, window = pristine_params()
    assert mu.shape == (1, 36) and cov.shape == (36, 36) and window.shape == (7, 7)
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    x = np.arange(-3, 4)
    g = np.exp(-(x[:, None] ** 2 + x[None, :] ** 2) / (2 * (7 / 6) ** 2))
    np.testing.assert_allclose(window, g / g.sum(), atol=1e-15)  # MATLAB fspecial('gaussian', 7, 7/6)
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    line = next(ln for ln in section.splitlines() if ln.startswith('"anysr.metrics"'))
    shipped = ast.literal_eval(line.split("=", 1)[1].strip())
    for name in ("niqe_pris_params.npz", "README.md"):
        assert (ROOT / "anysr" / "metrics" / "data" / name).is_file()
        assert any(fnmatch(f"data/{name}", p) for p in shipped), (name, shipped)


# --------------------------------------------------------------------------------------------------- LPIPS
def _lpips(net: str) -> LPIPS:
    return LPIPS(net=net, backbone=_seeded(f"lpips_{net}", "backbone_shapes"),
                 head=_seeded(f"lpips_{net}", "head_shapes"))


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_matches_package(net: str) -> None:
    data = load_file(str(FIX / f"lpips_{net}.safetensors"))
    model = _lpips(net)
    with torch.no_grad():
        got = model(_u8(data["x"]), _u8(data["y"]))
    assert got.shape == data["dist"].shape
    assert data["dist"].min() > 0.05  # values large enough for the tolerance to mean something
    torch.testing.assert_close(got, data["dist"], **FIXTURE_TOL)
    with torch.no_grad():
        same = model(_u8(data["x"]), _u8(data["x"]))
    assert same.abs().max() < 1e-6


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_state_dict_is_the_packages(net: str) -> None:
    """Same keys and shapes as ``lpips.LPIPS(net).state_dict()``: its saved state dicts load strictly."""
    own = {k: list(v.shape) for k, v in LPIPS(net=net).state_dict().items()}
    assert own == MANIFEST[f"lpips_{net}"]["state_dict_shapes"]


def test_lpips_state_dict_layouts() -> None:
    model = _lpips("alex")
    x, y = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    ref = model(x, y)
    combined = model.state_dict()  # the lpips package's own layout, heads listed twice
    assert "lin0.model.1.weight" in combined and "lins.0.model.1.weight" in combined
    assert "net.slice1.0.weight" in combined and "scaling_layer.shift" in combined
    fresh = LPIPS(net="alex")
    fresh.load_state_dict(combined, strict=True)
    assert torch.equal(fresh(x, y), ref)
    wrapped = LPIPS(net="alex").load_weights({f"module.{k}": v for k, v in combined.items()})
    assert torch.equal(wrapped(x, y), ref)
    # A head trained without dropout names its convolution model.0.
    head = {k.replace("model.1", "model.0"): v for k, v in _seeded("lpips_alex", "head_shapes").items()}
    tv = dict(_seeded("lpips_alex", "backbone_shapes"))
    tv["classifier.1.weight"] = torch.zeros(4, 4)  # a full torchvision state dict: classifier ignored
    assert torch.equal(LPIPS(net="alex", backbone=tv, head=head)(x, y), ref)


def test_lpips_errors_name_the_culprit() -> None:
    backbone = _seeded("lpips_alex", "backbone_shapes")
    head = _seeded("lpips_alex", "head_shapes")
    with pytest.raises(CheckpointError, match="missing lin0.model.1.weight"):
        LPIPS(net="alex", backbone=backbone)
    with pytest.raises(CheckpointError, match=r"missing net.slice2.3.weight.*alexnet"):
        LPIPS(net="alex", backbone=_seeded("lpips_vgg", "backbone_shapes"), head=head)
    wrong = dict(backbone)
    wrong["features.0.weight"] = torch.zeros(64, 1, 11, 11)
    with pytest.raises(CheckpointError, match=r"net.slice1.0.weight has shape \(64, 1, 11, 11\)"):
        LPIPS(net="alex", backbone=wrong, head=head)
    with pytest.raises(CheckpointError, match="unexpected key"):
        LPIPS(net="alex").load_weights({"foo.weight": torch.zeros(1)})
    with pytest.raises(OptionError, match="net"):
        LPIPS(net="squeeze")
    with pytest.raises(OptionError, match="version"):
        LPIPS(net="alex", version="0.0")
    with pytest.raises(DataError, match="same shape"):
        LPIPS(net="alex")(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 30))


# --------------------------------------------------------------------------------------------------- DISTS
def _dists() -> DISTS:
    return DISTS(vgg=_seeded("dists", "vgg_shapes"), alpha_beta=_seeded("dists", "head_shapes"))


def test_dists_matches_package() -> None:
    data = load_file(str(FIX / "dists.safetensors"))
    model = _dists()
    with torch.no_grad():
        got = model(_u8(data["x"]), _u8(data["y"]))
    assert got.shape == data["score"].shape
    assert data["score"].min() > 0.05
    torch.testing.assert_close(got, data["score"], **FIXTURE_TOL)
    with torch.no_grad():
        same = model(_u8(data["x"]), _u8(data["x"]))
    assert same.abs().max() < 1e-5


def test_dists_state_dict_is_the_packages() -> None:
    own = {k: list(v.shape) for k, v in DISTS().state_dict().items()}
    assert own == MANIFEST["dists"]["state_dict_shapes"]


def test_dists_state_dict_layouts_and_errors() -> None:
    model = _dists()
    x, y = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)
    ref = model(x, y)
    full = model.state_dict()  # DISTS_pytorch's names: stage{k}.N.weight, stage2.4.filter, mean, std, alpha, beta
    for key in ("stage1.0.weight", "stage2.4.filter", "stage5.28.bias", "mean", "std", "alpha", "beta"):
        assert key in full
    fresh = DISTS()
    fresh.load_state_dict(full, strict=True)
    assert torch.equal(fresh(x, y), ref)
    assert torch.equal(DISTS().load_weights(full)(x, y), ref)
    with pytest.raises(CheckpointError, match="missing alpha, beta"):
        DISTS(vgg=_seeded("dists", "vgg_shapes"))
    with pytest.raises(CheckpointError, match="alpha has shape"):
        DISTS(vgg=_seeded("dists", "vgg_shapes"), alpha_beta={"alpha": torch.ones(1, 5, 1, 1),
                                                              "beta": torch.ones(1, 1475, 1, 1)})
    with pytest.raises(CheckpointError, match="unexpected key 'lin0.model.1.weight'"):
        DISTS().load_weights(_seeded("lpips_alex", "head_shapes"))


# --------------------------------------------------------------------------------------- autocast / purity
@pytest.mark.parametrize("which", ["lpips", "dists"])
def test_bf16_autocast_runs_and_stays_close(which: str) -> None:
    model = _lpips("alex") if which == "lpips" else _dists()
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(1, 3, 32, 32, generator=g), torch.rand(1, 3, 32, 32, generator=g)
    with torch.no_grad():
        ref = model(x, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x, y)
    assert low.dtype == torch.float32 and low.shape == ref.shape
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low, ref, rtol=0.1, atol=0.02)


def test_metric_modules_are_pure() -> None:
    """DESIGN principle 1, and no torchvision / scipy (the main environment has neither)."""
    bad_import = re.compile(r"^\s*(import|from)\s+(torchvision|scipy|torch_xla|torch\.distributed)\b", re.M)
    bad_call = re.compile(r"\.cuda\(|torch\.cuda|torch\.distributed|torch_xla")
    for name in MODULES:
        src = (ROOT / "anysr" / "metrics" / f"{name}.py").read_text()
        assert not bad_import.search(src), name
        assert not bad_call.search(src), name


def test_metric_infos_flag_the_direction() -> None:
    for name in ("niqe", "lpips", "dists", "fid"):
        assert METRIC_INFOS[name].better == "lower" and METRIC_INFOS[name].lower_is_better
    for name in ("psnr", "ssim"):
        assert METRIC_INFOS[name].better == "higher"
    assert metric_info("calculate_niqe") is METRIC_INFOS["niqe"] and not METRIC_INFOS["niqe"].needs_gt
    assert metric_info("calculate_fid") is METRIC_INFOS["fid"] and not METRIC_INFOS["fid"].per_image
    assert METRIC_INFOS["lpips"].needs_weights and not METRIC_INFOS["niqe"].needs_weights
    assert metric_info("nope") is None
    from anysr.metrics import dists, lpips, niqe

    assert niqe.BETTER == lpips.BETTER == dists.BETTER == fid_mod.BETTER == "lower"


# ----------------------------------------------------------------------------------------------------- FID
@pytest.fixture(scope="module")
def inception() -> FIDInceptionV3:
    return FIDInceptionV3().load_fid_weights(_seeded("fid", "inception_shapes"))


def test_fid_inception_features_match_pytorch_fid(inception: FIDInceptionV3) -> None:
    data = load_file(str(FIX / "fid.safetensors"))
    with torch.no_grad():
        got = inception(_u8(data["images"]))
    assert got.shape == (2, 2048)
    assert data["features"].abs().max() > 0.5
    torch.testing.assert_close(got, data["features"], **FEATURE_TOL)


@pytest.mark.slow
def test_fid_inception_features_of_another_size(inception: FIDInceptionV3) -> None:
    data = load_file(str(FIX / "fid.safetensors"))
    with torch.no_grad():
        got = inception(_u8(data["odd_image"]))
    torch.testing.assert_close(got, data["odd_features"], **FEATURE_TOL)


def test_fid_inception_weight_layouts(inception: FIDInceptionV3) -> None:
    shapes = MANIFEST["fid"]["inception_shapes"]
    assert "fc.weight" in shapes and "Mixed_7c.branch_pool.bn.running_var" in shapes  # the file's own names
    own = inception.state_dict()
    assert {k: list(v.shape) for k, v in own.items()} == {k: v for k, v in shapes.items() if not k.startswith("fc.")}
    # pytorch-fid's / BasicSR's InceptionV3 wrapper: blocks.<b>.<i>.
    blocks = [["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3"], ["Conv2d_3b_1x1", "Conv2d_4a_3x3"],
              ["Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"],
              ["Mixed_7a", "Mixed_7b", "Mixed_7c"]]
    where = {name: f"blocks.{b}.{i}" for b, names in enumerate(blocks) for i, name in enumerate(names)}
    wrapped = {f"{where[k.split('.', 1)[0]]}.{k.split('.', 1)[1]}": v for k, v in own.items()}
    converted = fid_inception_state_dict(wrapped)
    assert converted.keys() == own.keys()
    assert all(torch.equal(converted[k], own[k]) for k in own)
    # An old file without the batch-norm counters loads too.
    no_counters = {k: v for k, v in own.items() if not k.endswith("num_batches_tracked")}
    FIDInceptionV3().load_fid_weights(no_counters)
    imagenet = dict(own)
    imagenet["fc.weight"] = torch.zeros(1000, 2048)
    with pytest.raises(CheckpointError, match="torchvision's ImageNet"):
        FIDInceptionV3().load_fid_weights(imagenet)
    with pytest.raises(DataError, match="RGB"):
        inception(torch.rand(1, 1, 80, 80))


@pytest.mark.parametrize("pair", ["a-b", "full_a-full_b", "low_a-low_b"])
def test_fid_matches_scipy_references(pair: str) -> None:
    """Both routes against BasicSR's and pytorch-fid's scipy values (observed: 1.1e-6, 2e-15, 2e-8 relative)."""
    data = load_file(str(FIX / "fid.safetensors"))
    ref = MANIFEST["fid"]["fid"][pair]
    a, b = (data[f"set_{k}"] for k in pair.split("-"))
    values = [fid_from_features(a, b.double().numpy())]
    if a.shape[1] < 100:  # the covariance route on 2048-d statistics is the slow test below
        values.append(calculate_fid(*feature_statistics(a), *feature_statistics(b)))
    for got in values:
        for who in ("basicsr", "pytorch_fid"):
            assert math.isclose(got, ref[who], rel_tol=FID_REL_TOL), (got, who, ref[who])


@pytest.mark.slow
def test_fid_of_2048_d_statistics_matches_scipy() -> None:
    """The covariance route (two 2048 x 2048 eigen-decompositions) on the Inception features."""
    data = load_file(str(FIX / "fid.safetensors"))
    got = calculate_fid(*feature_statistics(data["set_a"]), *feature_statistics(data["set_b"]))
    ref = MANIFEST["fid"]["fid"]["a-b"]["basicsr"]
    assert math.isclose(got, ref, rel_tol=FID_REL_TOL), (got, ref)
    assert math.isclose(got, fid_from_features(data["set_a"], data["set_b"]), rel_tol=1e-9)


def test_trace_sqrt_product_and_the_singular_guard(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 6))
    b = rng.standard_normal((6, 6))
    s1, s2 = a @ a.T, b @ b.T + np.eye(6)
    eig = np.linalg.eigvals(s1 @ s2)
    assert math.isclose(trace_sqrt_product(s1, s2), float(np.sqrt(eig.astype(complex)).real.sum()), rel_tol=1e-10)
    mu = np.zeros(6)
    assert abs(calculate_fid(mu, s1, mu, s1)) < 1e-9
    calls: list[np.ndarray] = []
    real = fid_mod.trace_sqrt_product

    def failing_once(x: np.ndarray, y: np.ndarray) -> float:
        calls.append(x)
        if len(calls) == 1:
            raise np.linalg.LinAlgError("Eigenvalues did not converge")
        return real(x, y)

    monkeypatch.setattr(fid_mod, "trace_sqrt_product", failing_once)
    with caplog.at_level(logging.WARNING, logger="anysr.metrics.fid"):
        value = calculate_fid(mu, s1, mu + 1, s2, eps=1e-3)
    assert "singular" in caplog.text
    np.testing.assert_allclose(calls[1], s1 + 1e-3 * np.eye(6))
    assert math.isclose(value, 6 + np.trace(s1) + np.trace(s2) - 2 * real(s1 + 1e-3 * np.eye(6),
                                                                           s2 + 1e-3 * np.eye(6)))
    with pytest.raises(DataError, match="different dimensions"):
        calculate_fid(mu, s1, np.zeros(5), np.eye(5))
    with pytest.raises(DataError, match="NaN"):
        calculate_fid(mu, s1 * np.nan, mu, s2)
    with pytest.raises(DataError, match="different dimensions"):
        fid_from_features(np.zeros((3, 4)), np.zeros((3, 5)))


def test_fid_statistics_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    mu, sigma = feature_statistics(rng.standard_normal((20, 8)))
    path = save_statistics(tmp_path / "stats" / "ref.npz", mu, sigma)
    got_mu, got_sigma = load_statistics(path)
    assert np.array_equal(got_mu, mu) and np.array_equal(got_sigma, sigma)
    np.savez_compressed(tmp_path / "pf.npz", mu=mu.astype(np.float32), sigma=sigma)  # as pytorch-fid writes
    assert np.allclose(load_statistics(tmp_path / "pf.npz")[0], mu, atol=1e-6)
    np.savez(tmp_path / "bad.npz", mean=mu)
    with pytest.raises(DataError, match="'mu' and 'sigma'"):
        load_statistics(tmp_path / "bad.npz")
    with pytest.raises(DataError, match="not found"):
        load_statistics(tmp_path / "missing.npz")
    with pytest.raises(OptionError, match=".npz"):
        save_statistics(tmp_path / "ref.txt", mu, sigma)
    with pytest.raises(DataError, match="at least 2"):
        feature_statistics(np.zeros((1, 8)))


class _ChannelStats(torch.nn.Module):
    """A stand-in feature extractor: per-channel mean and max of the RGB input (6-d)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches = getattr(self, "batches", []) + [x.shape[0]]
        return torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], 1) * self.scale


def test_folder_statistics_read_rgb_in_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    imgs = {"a.png": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
            "b.png": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
            "c.png": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
            "d.png": rng.integers(0, 256, (16, 16), dtype=np.uint8)}  # gray, another size
    for name, img in imgs.items():
        cv2.imwrite(str(tmp_path / name), img)
    (tmp_path / "notes.txt").write_text("not an image")
    model = _ChannelStats()
    mu, sigma = folder_statistics(tmp_path, model, batch_size=2)
    assert model.batches == [2, 1, 1]
    feats = []
    for name in sorted(imgs):
        img = imgs[name] if imgs[name].ndim == 3 else np.repeat(imgs[name][..., None], 3, axis=2)
        rgb = img[..., ::-1].astype(np.float64) / 255.0
        feats.append(np.concatenate([rgb.mean(axis=(0, 1)), rgb.max(axis=(0, 1))]))
    ref_mu, ref_sigma = np.mean(feats, axis=0), np.cov(np.array(feats), rowvar=False)
    np.testing.assert_allclose(mu, ref_mu, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sigma, ref_sigma, rtol=1e-5, atol=1e-7)
    padded = _ChannelStats()
    mu_p, sigma_p = folder_statistics(tmp_path, padded, batch_size=2, pad_to_batch=True)
    assert padded.batches == [2, 2, 2]
    np.testing.assert_allclose(mu_p, mu, rtol=1e-12)
    np.testing.assert_allclose(sigma_p, sigma, rtol=1e-12, atol=1e-15)
    with pytest.raises(DataError):
        folder_statistics(tmp_path / "nowhere", model)
    with pytest.raises(DataError, match="no images"):
        extract_features(model, [])


# ----------------------------------------------------------------------------------------------------- XLA
@pytest.mark.xla
def test_learned_metrics_on_xla_match_cpu() -> None:
    pytest.importorskip("torch_xla")
    import torch_xla

    device = torch_xla.device()
    g = torch.Generator().manual_seed(4)
    x, y = torch.rand(2, 3, 48, 48, generator=g), torch.rand(2, 3, 48, 48, generator=g)
    for model in (_lpips("alex"), _dists()):
        ref = model(x, y)
        got = model.to(device)(x.to(device), y.to(device)).cpu()
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
