"""BSRGAN's degradation models (KAIR's degradation_bsrgan / degradation_bsrgan_plus): the operators and whole
pipelines equal KAIR's on fixed draws (tools/fixtures/make_bsrgan_fixtures.py), the draws follow KAIR's
probabilities, and training on BSRGANDataset resumes exactly and runs from the command line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, assert_same_weights, run_cli, saved_weights, write_options

from anysr.cli import main
from anysr.data.degradation.bsrgan import (
    BSRGAN,
    BSRGANDraws,
    BSRGANPlus,
    BSRGANSettings,
    Step,
    anisotropic_gaussian_kernel,
    apply_draws,
    draw_rng,
    gaussian_kernel,
    shifted_gaussian_kernel,
)
from anysr.errors import OptionError
from anysr.ops.blind import convolve_mirror, resize_cv2
from anysr.ops.degradation import USMSharp
from anysr.ops.imresize import imresize_torch
from anysr.options import load_options

FIXTURES = ROOT / "tests" / "fixtures" / "bsrgan"
CASES = json.loads((FIXTURES / "cases.json").read_text())


class ReplayFields:
    """The fixture's noise fields: numpy's default_rng(seed) in KAIR's HWC layout, in call order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, shape: Any) -> torch.Tensor:
        return torch.from_numpy(self.rng.standard_normal(tuple(shape)))

    def poisson(self, rate: torch.Tensor) -> torch.Tensor:
        r = rate.numpy()
        counts = self.rng.poisson(r.transpose(1, 2, 0) if r.shape[0] == 3 else r[0]).astype(np.float64)
        return torch.from_numpy(counts.transpose(2, 0, 1) if counts.ndim == 3 else counts[None])


def _chw(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).float()


# ------------------------------------------------------------------------------------ operators vs KAIR
@pytest.mark.parametrize("mode,flag", [("linear", cv2.INTER_LINEAR), ("cubic", cv2.INTER_CUBIC),
                                       ("area", cv2.INTER_AREA)])
def test_resize_equals_cv2(mode: str, flag: int) -> None:
    img = np.random.default_rng(0).random((37, 53, 3)).astype(np.float32)
    for oh, ow in [(18, 26), (12, 17), (74, 106), (50, 70), (37, 60), (30, 53), (9, 13), (36, 52), (37, 53)]:
        ref = cv2.resize(img, (ow, oh), interpolation=flag)
        out = resize_cv2(_chw(img), (oh, ow), mode).permute(1, 2, 0).numpy()
        np.testing.assert_allclose(out, ref, atol=1e-5, err_msg=f"{mode} {oh}x{ow}")


def test_kernels_equal_kair() -> None:
    st = CASES["stages"]
    for c in st["aniso"]:
        np.testing.assert_allclose(anisotropic_gaussian_kernel(c["ksize"], c["theta"], c["l1"], c["l2"]), c["k"],
                                   rtol=1e-9, atol=1e-12)
    for c in st["gauss"]:
        np.testing.assert_allclose(gaussian_kernel(c["ksize"], c["sigma"]), c["k"], rtol=1e-9, atol=1e-12)
    for c in st["shifted"]:
        np.testing.assert_allclose(shifted_gaussian_kernel(c["sigma"], c["sf"]), c["k"], rtol=1e-9, atol=1e-12)


def test_mirror_convolution_sharpening_and_half_equal_kair() -> None:
    k = np.asarray(CASES["stages"]["shifted"][2]["k"])  # 25x25 on a 9x11 image: borders wider than the image
    out = convolve_mirror(_chw(np.load(FIXTURES / "conv_in.npy")), k).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(out, np.load(FIXTURES / "conv_out.npy"), atol=1e-6)
    bird = cv2.imread(str(ROOT / "datasets/Set5/HR/bird.png"))[:64, :64, ::-1].astype(np.float32) / 255
    sharp = USMSharp()(_chw(bird)[None])[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(sharp, np.load(FIXTURES / "sharpen_out.npy"), atol=1e-5)
    half = imresize_torch(_chw(bird), 0.5).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(half, np.load(FIXTURES / "half_out.npy"), atol=1e-5)


def _recorded(case: dict[str, Any]) -> tuple[BSRGANDraws, BSRGANSettings]:
    steps = tuple(Step(s["op"], {a: b for a, b in s.items() if a not in ("op", "size")}, tuple(s["size"]))
                  for s in case["steps"])
    settings = BSRGANSettings(case["scale"], 64, shuffle_prob=case.get("shuffle_prob", 0.1),
                              use_sharp=case.get("use_sharp", False))
    return BSRGANDraws(steps, case["top"], case["left"], 0), settings


@pytest.mark.parametrize("key", sorted(CASES["pipelines"]))
def test_pipeline_equals_kair(key: str) -> None:
    """Whole recipes KAIR drew (blur, both downsamplings, MATLAB x1/2, noises, Poisson, speckle, USM, JPEG): the
    LQ equals KAIR's on 8-bit levels. Exact, since the last step is the same OpenCV JPEG codec; a float-rounding
    difference before it could move a pixel across a rounding boundary, so allow a few pixels one level off."""
    case = CASES["pipelines"][key]
    draws, settings = _recorded(case)
    hr = _chw(np.load(FIXTURES / "hr.npy")) / 255
    lq, gt = apply_draws(hr, draws, settings, ReplayFields(case["field_seed"]))
    ref = _chw(np.load(FIXTURES / f"{key}_lq.npy"))
    diff = (lq - ref).abs() * 255
    assert lq.shape == ref.shape
    assert float(diff.max()) <= 1.0 + 1e-4 and float((diff > 0.5).float().mean()) < 0.01
    hq = np.load(FIXTURES / f"{key}_hq.npy") if case.get("use_sharp") else np.load(FIXTURES / "hr.npy") / 255
    torch.testing.assert_close(gt, _chw(hq.astype(np.float32)), atol=1e-5, rtol=0)


# -------------------------------------------------------------------------------------------- the draws
def _ops(draws: BSRGANDraws) -> list[str]:
    return [s.op for s in draws.steps]


def _check_ranges(s: Step, sf: int) -> None:
    """A drawn value within KAIR's range (blur kernel 7..25, sigmas, noise 2..25 / 255, JPEG 30..95)."""
    p = s.params
    if s.op == "blur":
        assert p["ksize"] in range(7, 26, 2)
        if p["kind"] == "gaussian":
            assert 0 <= p["sigma"] < 2 + 0.2 * 4  # wd at the largest scale the recipe may blur at
        else:
            assert 0 <= p["l1"] < 8 and 0 <= p["l2"] < 8 and 0 <= p["theta"] < np.pi
    elif s.op in ("noise", "speckle"):
        assert round(p["sigma"] * 255) in range(2, 26)
    elif s.op == "jpeg":
        assert p["quality"] in range(30, 96)
    elif s.op == "shifted_down":
        assert 0.1 <= p["sigma"] <= 0.6 * sf and p["sf"] == sf
    elif s.op == "poisson":
        assert 100 <= p["vals"] <= 10000


def test_draws_follow_kair_probabilities() -> None:
    """Over many counters: BSRGAN's x2 pre-downsampling 0.25, in-shuffle JPEG 0.9, camera 0.25, the downsample's
    kernel branch 0.25, the final downsample after the first; plus: Poisson / speckle / camera 0.1 each per half,
    two blurs and two resizes always. The noise kinds 0.4 / 0.2 / 0.4 and the resize filters uniform."""
    n = 1500
    bs, plus = BSRGAN(BSRGANSettings(4, 64)), BSRGANPlus(BSRGANSettings(4, 64, shuffle_prob=0.5))
    c: Counter[str] = Counter()
    for seed in range(n):
        d = bs.draw(draw_rng(seed), (64, 64))
        ops = _ops(d)
        first = d.steps[0]
        c["pre"] += first.op == "half_matlab" or (first.op == "resize" and first.size == (32, 32)
                                                   and "shifted_down" not in ops[:1])
        c["jpeg"] += ops.count("jpeg") - 1
        c["camera"] += ops.count("camera")
        c["kernel_down"] += ops.count("shifted_down")
        for s in d.steps:
            if s.op == "noise":
                c["noise_" + s.params["kind"]] += 1
            if s.op == "resize":
                c["mode_" + s.params["mode"]] += 1
            _check_ranges(s, 2 if ops[0] in ("half_matlab", "resize") and d.steps[0].size == (32, 32) else 4)
        assert d.steps[-1].op == "jpeg" and ops.count("blur") == 2 and ops.count("noise") == 1
        assert (d.top, d.left) == (0, 0) and d.steps[-1].size == (16, 16)
        p = plus.draw(draw_rng(seed), (64, 64))
        pops = _ops(p)
        for s in p.steps:
            _check_ranges(s, 4)
        assert pops.count("blur") == 2 and pops.count("resize") == 3 and pops[-1] == "jpeg"
        c["poisson"] += pops.count("poisson")
        c["speckle"] += pops.count("speckle")
        c["plus_camera"] += pops.count("camera")
    se = lambda p, m=1: 4 * (p * (1 - p) / (n * m)) ** 0.5  # noqa: E731
    assert abs(c["jpeg"] / n - 0.9) < se(0.9)
    assert abs(c["camera"] / n - 0.25) < se(0.25)
    assert abs(c["kernel_down"] / n - 0.25) < se(0.25)
    assert abs(c["pre"] / n - 0.25) < 0.06  # x2 first (a 32x32 resize can also be the main downsample's)
    kinds = [c["noise_gray"], c["noise_correlated"], c["noise_color"]]
    for got, p in zip(kinds, (0.4, 0.2, 0.4)):
        assert abs(got / n - p) < se(p)
    modes = [c[f"mode_{m}"] for m in ("linear", "cubic", "area")]
    assert max(modes) / min(modes) < 1.15
    for key in ("poisson", "speckle", "plus_camera"):
        assert abs(c[key] / (2 * n) - 0.1) < se(0.1, 2)


def test_draws_are_counter_based_and_keep_sizes() -> None:
    """The same seed gives the same recipe; scale 2 / 3 end at H / scale; plus shrinks no image to nothing."""
    for sf in (2, 3, 4):
        for cls in (BSRGAN, BSRGANPlus):
            pipe = cls(BSRGANSettings(sf, 16 * sf, degrade_size=16 * sf + 4 * sf))
            for seed in range(40):
                a, b = pipe.draw(draw_rng(seed), (20 * sf, 20 * sf)), pipe.draw(draw_rng(seed), (20 * sf, 20 * sf))
                assert a.as_dict() == b.as_dict()
                assert a.steps[-1].size == (20, 20) and 0 <= a.top <= 4 and 0 <= a.left <= 4


def test_dataset_items_are_fixed_size_and_seeded(tmp_path: Path) -> None:
    from anysr.data.bsrgan_dataset import BSRGANDataset

    opt = _train_options("ds", tmp_path)
    ds = BSRGANDataset(load_options(write_options(tmp_path / "o.yml", opt), [f"path.root={tmp_path}"],
                                    is_train=True)["datasets"]["train"])
    a, b = ds[(0, 123)], ds[(0, 123)]
    assert a["lq"].shape == (3, 8, 8) and a["gt"].shape == (3, 32, 32)
    assert torch.equal(a["lq"], b["lq"]) and torch.equal(a["gt"], b["gt"])
    assert not torch.equal(ds[(0, 124)]["lq"], a["lq"])


# ------------------------------------------------------------------------------------------ options, training
def _train_options(name: str, tmp: Path, **ds: Any) -> dict[str, Any]:
    return {
        "name": name, "model_type": "SRModel", "scale": 4, "accelerator": "cpu", "num_gpu": 1, "manual_seed": 3,
        "datasets": {"train": {"name": "t91", "type": "BSRGANDataset", "dataroot_gt": str(ROOT / "datasets/Set5/HR"),
                               "gt_size": 32, "degrade_size": 64, "use_hflip": True, "use_rot": True,
                               "num_worker_per_gpu": 0, "batch_size_per_gpu": 2, **ds}},
        "network_g": {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2,
                      "upscale": 4, "act_type": "prelu"},
        "path": {"pretrain_network_g": None},
        "train": {"precision": "fp32", "channels_last": False, "optim_g": {"type": "Adam", "lr": 1e-3},
                  "total_iter": 4, "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}},
        "logger": {"print_freq": 2, "save_checkpoint_freq": 2, "use_tb_logger": False},
    }


def test_kair_keys_and_defaults(tmp_path: Path) -> None:
    """KAIR's H_size is degrade_size; degradation_type, shuffle_prob and use_sharp default as KAIR's dataset."""
    opt = _train_options("k", tmp_path)
    del opt["datasets"]["train"]["degrade_size"]
    opt["datasets"]["train"]["H_size"] = 40
    train = load_options(write_options(tmp_path / "k.yml", opt), [f"path.root={tmp_path}"],
                         is_train=True)["datasets"]["train"]
    assert (train["degrade_size"], train["degradation_type"], train["shuffle_prob"], train["use_sharp"]) == (
        40, "bsrgan", 0.1, False)


def test_option_errors_name_the_key(tmp_path: Path) -> None:
    for ds, key in (({"degradation_type": "bsrgan_pls"}, "degradation_type"), ({"degrade_size": 30}, "degrade_size"),
                    ({"gt_size": None}, "gt_size"), ({"degradation_type": "bsrgan_plus", "degrade_size": 32},
                                                     "degrade_size")):
        path = write_options(tmp_path / "bad.yml", _train_options("bad", tmp_path, **ds))
        with pytest.raises(OptionError, match=f"datasets.train.{key}"):
            load_options(path, [f"path.root={tmp_path}"], is_train=True)


@pytest.mark.parametrize("variant", ["bsrgan", "bsrgan_plus"])
def test_resume_is_bit_exact(tmp_path: Path, variant: str) -> None:
    """4 iterations straight == 2, stop, resume, 2 (the plus variant's split run with 2 loader workers)."""
    workers = 2 if variant == "bsrgan_plus" else 0
    _straight_equals_stopped_and_resumed(tmp_path, {"degradation_type": variant},
                                         {"degradation_type": variant, "num_worker_per_gpu": workers})


def _straight_equals_stopped_and_resumed(tmp_path: Path, straight: dict[str, Any], split: dict[str, Any]) -> None:
    """4 iterations on the training set ``straight`` give the weights of 2 on ``split``, a stop, a resume, 2 more."""
    path = write_options(tmp_path / "a.yml", _train_options("a", tmp_path, **straight))
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    opt = _train_options("b", tmp_path, **split)
    opt["train"]["total_iter"] = 2
    path = write_options(tmp_path / "b.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    exp = tmp_path / "experiments"
    assert_same_weights(saved_weights(exp / "a", 4), saved_weights(exp / "b", 4))


# ------------------------------------------------------------------------------------ degrade_in: step
def _dataset(tmp: Path, **ds: Any) -> Any:
    from anysr.data.bsrgan_dataset import BSRGANDataset

    opt = _train_options("ds", tmp, **ds)
    return BSRGANDataset(load_options(write_options(tmp / "o.yml", opt), [f"path.root={tmp}"],
                                      is_train=True)["datasets"]["train"])


@pytest.mark.parametrize("ds", [{}, {"degradation_type": "bsrgan_plus", "use_sharp": True, "shuffle_prob": 0.5}])
def test_step_synthesis_gives_the_loaders_pairs(tmp_path: Path, ds: dict[str, Any]) -> None:
    """degrade_in: step hands the loader's HR squares to the training process, which degrades them by the same
    recipes and fields: the pairs of a batch equal the loader's, bit for bit on the same CPU."""
    from torch.utils.data import default_collate

    loader_set = _dataset(tmp_path, **ds)
    step_set = _dataset(tmp_path, degrade_in="step", **ds)
    assert loader_set.place_synthesis(static_shapes=False) is None  # auto: the loader
    stage = step_set.place_synthesis(static_shapes=False)
    assert stage is not None
    order = [(0, 11), (3, 11), (2, 40), (4, 7)]
    items = [step_set[ix] for ix in order]
    assert "lq" not in items[0] and items[0]["hr"].shape == (3, 64, 64)
    batch = stage(default_collate(items))
    assert "hr" not in batch and batch["lq"].shape == (4, 3, 8, 8) and batch["gt"].shape == (4, 3, 32, 32)
    for k, ix in enumerate(order):
        want = loader_set[ix]
        assert torch.equal(batch["lq"][k], want["lq"]) and torch.equal(batch["gt"][k], want["gt"]), ix
        assert int(batch["seed"][k]) == ix[1] and batch["gt_path"][k] == want["gt_path"]


def test_step_is_refused_where_shapes_are_static(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"datasets\.train\.degrade_in: step .*use degrade_in: loader"):
        _dataset(tmp_path, degrade_in="step").place_synthesis(static_shapes=True)
    assert _dataset(tmp_path, degrade_in="auto").place_synthesis(static_shapes=True) is None
    with pytest.raises(OptionError, match=r"datasets\.train\.degrade_in"):
        load_options(write_options(tmp_path / "bad.yml", _train_options("bad", tmp_path, degrade_in="device")),
                     [f"path.root={tmp_path}"], is_train=True)


def test_training_with_the_synthesis_in_the_step_equals_the_loaders(tmp_path: Path) -> None:
    """4 iterations with degrade_in: loader == 2 with degrade_in: step, stop, resume, 2 more (the same weights)."""
    _straight_equals_stopped_and_resumed(tmp_path, {"degrade_in": "loader"}, {"degrade_in": "step"})


@pytest.mark.slow
def test_cli_trains_the_shipped_option_file(tmp_path: Path) -> None:
    """`anysr train` on options/train/train_BSRGAN_x4.yml, made tiny from the command line."""
    run_cli("train", "-opt", str(ROOT / "options/train/train_BSRGAN_x4.yml"), "--force_yml", f"path.root={ROOT}",
            f"path.experiments_root={tmp_path / 'run'}",
            f"datasets.train.dataroot_gt={ROOT / 'datasets/Set5/HR'}", "datasets.train.gt_size=32",
            "datasets.train.degrade_size=64", "datasets.train.num_worker_per_gpu=0",
            "datasets.train.batch_size_per_gpu=2", "network_g.num_block=1", "network_g.num_feat=8",
            "network_g.num_grow_ch=4", "train.total_iter=2", "logger.save_checkpoint_freq=2", "num_gpu=1",
            "accelerator=cpu", "datasets.val=~", "datasets.val_2=~", "val=~", cwd=tmp_path)
    assert (tmp_path / "run" / "models" / "net_g_2.safetensors").is_file()


@pytest.mark.slow
def test_prepare_degrade_shows_the_training_pairs_and_recipes(tmp_path: Path) -> None:
    """`anysr prepare degrade` writes the pairs the dataset gives the training stream, and each pair's recipe."""
    from anysr.data.bsrgan_dataset import BSRGANDataset

    path = write_options(tmp_path / "p.yml", _train_options("p", tmp_path, degradation_type="bsrgan_plus"))
    proc = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--out",
                   str(tmp_path / "pairs"), "-n", "3", cwd=tmp_path)
    assert "wrote 3 LQ/GT pair(s)" in proc.stdout
    report = json.loads((tmp_path / "pairs" / "degrade.json").read_text())
    pairs = report["pairs"] if isinstance(report, dict) else report
    opt = load_options(path, [f"path.root={tmp_path}"], is_train=True)
    ds = BSRGANDataset(opt["datasets"]["train"])
    for rec in pairs:
        assert rec["degradation"]["type"] == "bsrgan_plus" and rec["degradation"]["steps"][-1]["op"] == "jpeg"
        item = ds[(rec["index"], rec["sample_seed"])]
        lq = cv2.imread(str(tmp_path / "pairs" / rec["files"]["lq"][0]))[..., ::-1]
        assert np.array_equal(lq, (item["lq"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path: Path) -> None:
    """A global batch of 4: one process degrading in the loader, or two CPU ranks of 2 degrading in the step (each
    sample's pair depends on its seed only)."""
    for name, batch, gpus, where in (("one", 4, 1, "loader"), ("two", 2, 2, "step")):
        opt = _train_options(name, tmp_path, batch_size_per_gpu=batch, degrade_in=where)
        opt["num_gpu"] = gpus
        run_cli("train", "-opt", str(write_options(tmp_path / f"{name}.yml", opt)), "--force_yml",
                f"path.root={tmp_path}", cwd=tmp_path)
    exp = tmp_path / "experiments"
    a, b = saved_weights(exp / "one", 4), saved_weights(exp / "two", 4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert json.loads((exp / "two" / "summary.json").read_text())["accelerator"]["world_size"] == 2


def test_sixteen_bit_gt_stays_sixteen_bit(tmp_path: Path) -> None:
    """A 16-bit HR: the GT patch keeps its low byte, the LQ ends on 8-bit levels (the final JPEG)."""
    from anysr.data.bsrgan_dataset import BSRGANDataset

    folder = tmp_path / "hr16"
    folder.mkdir()
    img = cv2.imread(str(ROOT / "datasets/Set5/HR/baby.png")).astype(np.uint16) * 257 + 3
    cv2.imwrite(str(folder / "baby.png"), img)
    opt = _train_options("b16", tmp_path, dataroot_gt=str(folder), use_hflip=False, use_rot=False)
    ds = BSRGANDataset(load_options(write_options(tmp_path / "o.yml", opt), [f"path.root={tmp_path}"],
                                    is_train=True)["datasets"]["train"])
    item = ds[(0, 7)]
    assert item["bits"] == 16
    gt16 = item["gt"] * 65535
    assert torch.allclose(gt16, gt16.round(), atol=1e-2) and bool(((gt16.round() % 257) == 3).all())
    lq8 = item["lq"] * 255
    assert torch.allclose(lq8, lq8.round(), atol=1e-3)
