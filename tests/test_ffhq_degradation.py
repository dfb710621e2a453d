"""GFPGAN's ``FFHQDegradationDataset``: the pipeline against GFPGAN's own code on fixed draws, the draws against the
option ranges, seeding, flipped component boxes, gray, GFPGAN's option files, the landmarks file and its errors.

Fixtures: ``tools/fixtures/make_ffhq_degradation_fixtures.py`` (GFPGAN's dataset and BasicSR 1.4.2's degradations
run unchanged on scripted draws).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, assert_seeded_samples
from safetensors.numpy import load_file

from anysr.data import build_dataset
from anysr.data.degradation.gfpgan import (
    JITTERS,
    FaceDegradationDraws,
    FaceDegradationSettings,
    draw_face_degradation,
)
from anysr.data.ffhq_degradation_dataset import FFHQDegradationDataset
from anysr.errors import DataError, OptionError
from anysr.ops.color import adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation
from anysr.options.loader import validate_dataset

FIXTURES = ROOT / "tests" / "fixtures" / "ffhq_degradation"
META = json.loads((FIXTURES / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURES / "expected.safetensors"))
OPTION_FILES = ROOT / "tests" / "fixtures" / "gfpgan_options"
SMALL = ("00000000", "00000001", "00000003")  # the 64x64 fixture faces
LANDMARKS = {"left_eye": [20.5, 24.25, 4.5], "right_eye": [42.75, 25.5, 4.0], "mouth": [31.0, 47.5, 7.25]}


def _options(root: Path, **keys: Any) -> Any:
    base = {"type": "FFHQDegradationDataset", "dataroot_gt": str(root), "batch_size_per_gpu": 1, "out_size": 64,
            "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "use_hflip": True}
    return validate_dataset({**base, **keys}, name="train")


def _dataset(root: Path, **keys: Any) -> FFHQDegradationDataset:
    return build_dataset(_options(root, **keys), "datasets.train")  # type: ignore[return-value]


def _landmarks(path: Path, names: tuple[str, ...] = SMALL, kind: str = "numpy") -> Path:
    """A landmarks file like GFPGAN's (numpy float64 scalars), or with tensors / plain lists."""
    conv = {"numpy": lambda v: [np.float64(x) for x in v], "tensor": lambda v: torch.tensor(v),
            "list": lambda v: list(v), "array": lambda v: np.asarray(v)}[kind]
    torch.save({n: {part: conv(v) for part, v in LANDMARKS.items()} for n in names}, path)
    return path


@pytest.fixture()
def faces(tmp_path: Path) -> Path:
    """A folder of three 64x64 faces (the fixture's Set5 crops)."""
    root = tmp_path / "faces"
    root.mkdir()
    for stem in SMALL:
        shutil.copy(FIXTURES / "images" / f"{stem}.png", root / f"{stem}.png")
    return root


# ------------------------------------------------------------------------------------ equality with GFPGAN
@pytest.mark.parametrize("key", sorted(META["cases"]))
def test_pipeline_equals_gfpgan(tmp_path: Path, key: str) -> None:
    """The whole item (read, flip, degrade, jitter, gray, normalise, boxes) on the fixture's recipe: the LQ on the
    same 8-bit levels as GFPGAN's (the same OpenCV for filter2D, resize and JPEG; float math may flip a rounding, so
    one level on a few pixels is allowed), the GT and the boxes to float tolerance."""
    case = META["cases"][key]
    root = tmp_path / "gt"
    root.mkdir()
    shutil.copy(FIXTURES / "images" / f"{case['stem']}.png", root)
    opts = {k: v for k, v in case["options"].items()}
    ds = _dataset(root, **opts, component_path=str(FIXTURES / "landmarks.pth"))
    draws = FaceDegradationDraws.from_dict(case["draws"])
    item = ds.make_item(0, draws)
    lq = np.rint((item["lq"].numpy() * 0.5 + 0.5) * 255.0)
    diff = np.abs(lq - EXPECTED[f"{key}.lq"].astype(np.float64))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.005, (diff.max(), (diff > 0).mean())
    if f"{key}.gt" in EXPECTED:  # a gray GT, stored as float16
        torch.testing.assert_close(item["gt"], torch.from_numpy(EXPECTED[f"{key}.gt"].astype(np.float32)),
                                   atol=1e-3, rtol=0)
    else:
        img = cv2.imread(str(root / f"{case['stem']}.png"), cv2.IMREAD_COLOR)[:, :: -1 if draws.hflip else 1, ::-1]
        want = (torch.from_numpy(img.transpose(2, 0, 1).copy()).float() / 255 - 0.5) / 0.5
        torch.testing.assert_close(item["gt"], want, atol=1e-6, rtol=0)
    assert sorted(k for k in item if k.startswith("loc_")) == sorted(case["boxes"])
    for name, box in case["boxes"].items():
        torch.testing.assert_close(item[name], torch.tensor(box, dtype=torch.float32), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", JITTERS)
def test_colour_jitter_equals_torchvision(name: str) -> None:
    fn = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation,
          "hue": adjust_hue}[name]
    x = torch.from_numpy(EXPECTED["jitter.input"])
    keys = [k for k in EXPECTED if k.startswith(f"jitter.{name}.")]
    assert keys
    for k in keys:
        torch.testing.assert_close(fn(x, float(k.split(".", 2)[2])), torch.from_numpy(EXPECTED[k]), atol=2e-6, rtol=0)


# ------------------------------------------------------------------------------------------------ the draws
def test_draws_follow_the_option_ranges() -> None:
    """Over many counters: the flip 1/2, the kernel kinds by kernel_prob, sigmas / rotation / factor / noise level
    uniform in their ranges, JPEG qualities rounded uniform draws, each coin at its probability, the jitter order a
    uniform permutation and its factors in their ranges."""
    n = 3000
    s = FaceDegradationSettings(kernel_list=("iso", "aniso", "generalized_iso"), kernel_prob=(0.5, 0.3, 0.2),
                                blur_sigma=(0.1, 10), downsample_range=(0.8, 8), noise_range=(0, 20),
                                jpeg_range=(60, 100), color_jitter_prob=0.3, color_jitter_shift=20,
                                color_jitter_pt_prob=0.4, gray_prob=0.1)
    c: Counter[str] = Counter()
    values: dict[str, list[float]] = {k: [] for k in ("sigma", "rotation", "scale", "noise", "shift", "first")}
    qualities: Counter[int] = Counter()
    for seed in range(n):
        d = draw_face_degradation(np.random.default_rng([seed, 8]), s, use_hflip=True)
        c["flip"] += d.hflip
        c[d.kernel.kind] += 1
        assert d.kernel.size == 41 and 0.1 <= d.kernel.sigma_x <= 10 and 0.1 <= d.kernel.sigma_y <= 10
        values["sigma"].append(d.kernel.sigma_x)
        if d.kernel.kind == "aniso":
            values["rotation"].append(d.kernel.rotation)
        elif d.kernel.kind == "iso":
            assert d.kernel.sigma_y == d.kernel.sigma_x and d.kernel.rotation == 0
        else:
            assert 0.5 <= d.kernel.beta <= 8
        assert 0.8 <= d.scale <= 8 and d.noise_sigma is not None and 0 <= d.noise_sigma <= 20
        values["scale"].append(d.scale)
        values["noise"].append(d.noise_sigma)
        assert d.jpeg_quality is not None and 60 <= d.jpeg_quality <= 100
        qualities[d.jpeg_quality] += 1
        if d.color_shift is not None:
            c["shift"] += 1
            assert all(abs(v) <= 20 / 255 for v in d.color_shift)
            values["shift"] += list(d.color_shift)
        c["gray"] += d.gray
        if d.jitter is not None:
            c["jitter"] += 1
            assert sorted(n for n, _ in d.jitter) == sorted(JITTERS)
            values["first"].append(JITTERS.index(d.jitter[0][0]))
            for name, f in d.jitter:
                lo, hi = getattr(s, name)
                assert lo <= f <= hi
    se = lambda p, m=n: 4 * (p * (1 - p) / m) ** 0.5  # noqa: E731
    for key, p in (("flip", 0.5), ("iso", 0.5), ("aniso", 0.3), ("generalized_iso", 0.2), ("shift", 0.3),
                   ("gray", 0.1), ("jitter", 0.4)):
        assert abs(c[key] / n - p) < se(p), (key, c[key] / n)

    def uniform(xs: list[float], lo: float, hi: float) -> None:  # mean and variance of U(lo, hi)
        a = np.asarray(xs)
        assert abs(a.mean() - (lo + hi) / 2) < 4 * (hi - lo) / math.sqrt(12 * len(a))
        assert abs(a.var() / ((hi - lo) ** 2 / 12) - 1) < 0.1
    uniform(values["sigma"], 0.1, 10)
    uniform(values["rotation"], -math.pi, math.pi)
    uniform(values["scale"], 0.8, 8)
    uniform(values["noise"], 0, 20)
    uniform(values["shift"], -20 / 255, 20 / 255)
    firsts = Counter(values["first"])
    assert all(abs(firsts[k] / len(values["first"]) - 0.25) < se(0.25, len(values["first"])) for k in range(4))
    inner = [qualities[q] / n for q in range(61, 100)]  # rounding: 1/40 each, the two ends half of that
    assert abs(np.mean(inner) - 1 / 40) < 0.002 and max(qualities[60], qualities[100]) / n < 1 / 40


def test_null_ranges_and_probabilities_turn_steps_off() -> None:
    s = FaceDegradationSettings(noise_range=None, jpeg_range=None, color_jitter_prob=None, color_jitter_pt_prob=1.0,
                                brightness=None, hue=None, gray_prob=0.0)
    for seed in range(50):
        d = draw_face_degradation(np.random.default_rng(seed), s, use_hflip=False)
        assert d.noise_sigma is None and d.jpeg_quality is None and d.color_shift is None and not d.gray
        assert not d.hflip and d.jitter is not None and sorted(n for n, _ in d.jitter) == ["contrast", "saturation"]


def test_same_seed_same_sample_in_any_order_and_worker(faces: Path, tmp_path: Path) -> None:
    lm = _landmarks(tmp_path / "lm.pth")
    keys = {"color_jitter_prob": 0.5, "color_jitter_pt_prob": 0.5, "gray_prob": 0.3, "crop_components": True,
            "component_path": str(lm)}
    order = [(0, 7), (2, 7), (1, 123), (0, 8), (2, 99)]
    assert_seeded_samples(lambda: _dataset(faces, **keys), order, via_loader=("lq", "loc_mouth"))
    ds = _dataset(faces, **keys)
    record = ds.degradation_record(7)
    assert json.loads(json.dumps(record)) == record and record["type"] == "gfpgan"
    assert FaceDegradationDraws.from_dict(record).as_dict() == ds.draws(7).as_dict()


# ------------------------------------------------------------------------------------- boxes, flip, gray
def test_component_boxes_flip_with_the_image(faces: Path, tmp_path: Path) -> None:
    lm = _landmarks(tmp_path / "lm.pth")
    ds = _dataset(faces, crop_components=True, component_path=str(lm), eye_enlarge_ratio=1.5, noise_range=None,
                  jpeg_range=None)
    base = ds.draws(3).as_dict()
    plain = ds.make_item(1, FaceDegradationDraws.from_dict({**base, "hflip": False}))
    flipped = ds.make_item(1, FaceDegradationDraws.from_dict({**base, "hflip": True}))
    torch.testing.assert_close(flipped["gt"], plain["gt"].flip(-1), atol=0, rtol=0)
    (lx, ly, lh), (rx, ry, rh), (mx, my, mh) = LANDMARKS.values()
    want_plain = {"loc_left_eye": [lx - 1.5 * lh + 1, ly - 1.5 * lh + 1, lx + 1.5 * lh, ly + 1.5 * lh],
                  "loc_right_eye": [rx - 1.5 * rh + 1, ry - 1.5 * rh + 1, rx + 1.5 * rh, ry + 1.5 * rh],
                  "loc_mouth": [mx - mh + 1, my - mh + 1, mx + mh, my + mh]}
    mirrored = {"loc_left_eye": (64 - rx, ry, 1.5 * rh), "loc_right_eye": (64 - lx, ly, 1.5 * lh),
                "loc_mouth": (64 - mx, my, mh)}
    for name, box in want_plain.items():
        torch.testing.assert_close(plain[name], torch.tensor(box), atol=1e-5, rtol=0)
        x, y, h = mirrored[name]
        torch.testing.assert_close(flipped[name], torch.tensor([x - h + 1, y - h + 1, x + h, y + h]), atol=1e-5,
                                   rtol=0)
    again = ds.make_item(1, FaceDegradationDraws.from_dict({**base, "hflip": False}))  # the table was not altered
    assert torch.equal(again["loc_left_eye"], plain["loc_left_eye"])
    assert "loc_mouth" not in _dataset(faces)[0]


@pytest.mark.parametrize("gt_gray", [False, True])
def test_gray_prob_and_gt_gray(faces: Path, gt_gray: bool) -> None:
    ds = _dataset(faces, gray_prob=1.0, gt_gray=gt_gray)
    for seed in range(3):
        item = ds[(seed % 3, seed)]
        assert ds.draws(seed).gray
        assert torch.equal(item["lq"][0], item["lq"][1]) and torch.equal(item["lq"][1], item["lq"][2])
        gray_gt = torch.equal(item["gt"][0], item["gt"][1]) and torch.equal(item["gt"][1], item["gt"][2])
        assert gray_gt == gt_gray
    never = _dataset(faces, gray_prob=0.0)
    assert not any(never.draws(s).gray for s in range(200))
    assert 0.3 < np.mean([_dataset(faces, gray_prob=0.5).draws(s).gray for s in range(200)]) < 0.7


# ------------------------------------------------------------------------------------------ option files
@pytest.mark.parametrize("name", ["train_gfpgan_v1.yml", "train_gfpgan_v1_simple.yml"])
def test_gfpgan_option_files_validate_and_load(tmp_path: Path, name: str) -> None:
    """GFPGAN's train dataset sections as they are, only the image folder and the landmarks file moved: a 512x512
    face (Set5's baby) and a fake landmarks file; GFPGAN's values and defaults come through."""
    train = yaml.safe_load((OPTION_FILES / name).read_text())["datasets"]["train"]
    root = tmp_path / "ffhq_512"
    root.mkdir()
    shutil.copy(ROOT / "datasets" / "Set5" / "HR" / "baby.png", root / "00000000.png")
    train["dataroot_gt"] = str(root)
    if "component_path" in train:
        train["component_path"] = str(_landmarks(tmp_path / "FFHQ_eye_mouth_landmarks_512.pth", ("00000000",)))
    opt = validate_dataset(train, name="train", scale=1)
    assert (opt["type"], opt["out_size"], opt["blur_kernel_size"], opt["noise_range"], opt["jpeg_range"]) == (
        "FFHQDegradationDataset", 512, 41, [0.0, 20.0], [60.0, 100.0])
    assert (opt["gray_prob"], opt["color_jitter_shift"], opt["hue"], opt["gt_gray"]) == (0.01, 20.0, [-0.1, 0.1], False)
    ds = build_dataset(opt, "datasets.train")
    assert ds.check(decode=False, progress=False) == []
    item = ds[(0, 5)]
    assert item["lq"].shape == item["gt"].shape == (3, 512, 512)
    assert item["lq"].min() >= -1 and item["lq"].max() <= 1
    assert ("loc_left_eye" in item) == (name == "train_gfpgan_v1.yml")
    with pytest.raises(OptionError, match=r"datasets\.train\.type: FFHQDegradationDataset makes LQ faces of the GT's "
                                          r"size: it needs scale 1, got 4"):
        validate_dataset(train, name="train", scale=4)


@pytest.mark.parametrize("kind", ["numpy", "tensor", "list", "array"])
def test_landmarks_files_load_safely(faces: Path, tmp_path: Path, kind: str) -> None:
    ds = _dataset(faces, crop_components=True, component_path=str(_landmarks(tmp_path / "lm.pth", kind=kind)))
    assert ds.locations is not None and ds.locations.shape == (3, 3, 3)
    np.testing.assert_array_equal(ds.locations[2], np.asarray(list(LANDMARKS.values())))


# --------------------------------------------------------------------------------------------- bad input
def _one_line(exc: pytest.ExceptionInfo[BaseException], *parts: str) -> None:
    msg = str(exc.value)
    lines = msg.splitlines()
    problem = lines[-1] if isinstance(exc.value, OptionError) else msg
    assert len(lines) == (2 if isinstance(exc.value, OptionError) else 1), msg  # OptionError: "1 problem(s):" + one
    for part in parts:
        assert part in problem, (part, msg)


def test_bad_landmarks_give_one_line(faces: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pth"
    with pytest.raises(OptionError) as exc:
        _options(faces, crop_components=True, component_path=str(missing))
    _one_line(exc, "datasets.train.component_path", str(missing), "does not exist")
    with pytest.raises(OptionError) as exc:
        _options(faces, crop_components=True)
    _one_line(exc, "datasets.train.component_path", "required by crop_components")
    opt = dict(_options(faces, crop_components=True, component_path=str(_landmarks(tmp_path / "ok.pth"))))
    with pytest.raises(DataError) as exc:
        FFHQDegradationDataset({**opt, "component_path": str(missing)})
    _one_line(exc, "component_path", str(missing), "does not exist")
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(b"PK\x03\x04 not a torch file")
    with pytest.raises(DataError) as exc:
        FFHQDegradationDataset({**opt, "component_path": str(corrupt)})
    _one_line(exc, str(corrupt), "cannot be read")
    unsafe = tmp_path / "unsafe.pth"
    torch.save({"00000000": argparse.Namespace(left_eye=1)}, unsafe)  # a pickled object: refused, never run
    with pytest.raises(DataError) as exc:
        FFHQDegradationDataset({**opt, "component_path": str(unsafe)})
    _one_line(exc, str(unsafe), "argparse.Namespace")
    partial = _landmarks(tmp_path / "partial.pth", ("00000000", "00000003"))
    with pytest.raises(DataError) as exc:
        FFHQDegradationDataset({**opt, "component_path": str(partial)})
    _one_line(exc, str(partial), "no entry '00000001'")
    malformed = tmp_path / "malformed.pth"
    torch.save({n: {"left_eye": [1.0, 2.0, 3.0], "right_eye": [1.0, 2.0], "mouth": [1, 2, 3]} for n in SMALL},
               malformed)
    with pytest.raises(DataError) as exc:
        FFHQDegradationDataset({**opt, "component_path": str(malformed)})
    _one_line(exc, str(malformed), "'00000000' right_eye")


@pytest.mark.parametrize(("keys", "where", "says"), [
    ({"blur_kernal_size": 21}, "datasets.train.blur_kernal_size", "blur_kernel_size"),
    ({"blur_kernel_size": 20}, "datasets.train.blur_kernel_size", "odd"),
    ({"kernel_list": ["iso", "sinc"], "kernel_prob": [1, 1]}, "datasets.train.kernel_list", "sinc"),
    ({"kernel_prob": [1.0]}, "datasets.train.kernel_prob", "one weight per kind"),
    ({"jpeg_range": [60, 120]}, "datasets.train.jpeg_range", "high <= 100"),
    ({"hue": [-0.1, 0.7]}, "datasets.train.hue", "high <= 0.5"),
    ({"downsample_range": [1, 100]}, "datasets.train.downsample_range", "to nothing"),
    ({"gray_prob": 1.5}, "datasets.train.gray_prob", "1"),
    ({"out_size": None}, "datasets.train.out_size", "required"),
    ({"gt_size": 32}, "datasets.train.gt_size", "is not read by FFHQDegradationDataset"),
    ({"crop_pad_size": 100}, "datasets.train.crop_pad_size", "is not read"),
    ({"use_rot": True}, "datasets.train.use_rot", "not supported"),
])
def test_bad_options_name_the_key(faces: Path, keys: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(OptionError) as exc:
        _options(faces, **keys)
    _one_line(exc, where, says)


def test_faces_of_another_size_are_found_before_training(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    root.mkdir()
    shutil.copy(FIXTURES / "images" / "00000000.png", root)
    shutil.copy(FIXTURES / "images" / "00000002.png", root)  # 128x128
    ds = _dataset(root)
    problems = ds.check(decode=False, progress=False)
    assert len(problems) == 1 and "00000002.png is 128x128" in problems[0] and "out_size" in problems[0]
    with pytest.raises(DataError, match="00000002.png is 128x128"):
        ds[1]
