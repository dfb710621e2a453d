"""RestoreFormer++'s training sets (``FFHQUnevenDegradationDataset``, ``FFHQAugDataset``): each stage and each whole
sample against the authors' code on fixed draws, the draws against their rates and ranges, seeding, the moved
component boxes, the authors' option values and bad keys.

Fixtures: ``tools/fixtures/make_restoreformer_data_fixtures.py`` (the authors' three dataset classes and BasicSR
1.4.2's degradations run unchanged on scripted draws).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_seeded_samples
from safetensors.numpy import load_file

from anysr.data import build_dataset
from anysr.data.degradation.restoreformer import (
    FaceAugmentDraws,
    UnevenDegradationDraws,
    UnevenDegradationSettings,
    _branch,
    draw_uneven_degradation,
    expose_and_shift,
    patch_range,
)
from anysr.data.ffhq_degradation_dataset import _float_bgr
from anysr.data.restoreformer_dataset import FFHQAugDataset, FFHQUnevenDegradationDataset
from anysr.errors import OptionError
from anysr.options.loader import validate_dataset

FIXTURES = ROOT / "tests" / "fixtures" / "restoreformer_data"
IMAGES = ROOT / "tests" / "fixtures" / "ffhq_degradation" / "images"
META = json.loads((FIXTURES / "cases.json").read_text())
EXPECTED = load_file(str(FIXTURES / "expected.safetensors"))
DEGRADED = sorted(k for k, c in META["cases"].items() if c["cls"] != "FFHQAugDataset")
AUGMENTED = sorted(k for k, c in META["cases"].items() if c["cls"] == "FFHQAugDataset")
SMALL = ("00000000", "00000001", "00000003")  # the 64x64 fixture faces
# the authors' RestoreFormerPlusPlus.yaml and ROHQD.yaml train sets (data.params.train.params; paths aside)
RFPP = {"type": "FFHQUnevenDegradationDataset", "use_hflip": True, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
        "out_size": 64, "blur_kernel_size": [19, 20], "kernel_list": ["iso", "aniso"], "kernel_prob": [0.5, 0.5],
        "blur_sigma": [0.1, 10], "downsample_range": [0.8, 8], "noise_range": [0, 20], "jpeg_range": [60, 100],
        "color_jitter_prob": None, "color_jitter_shift": 20, "color_jitter_pt_prob": None, "gray_prob": 0.008,
        "gt_gray": True, "exposure_prob": None, "exposure_range": [0.7, 1.1], "shift_prob": 0.2, "shift_unit": 1,
        "shift_max_num": 32, "uneven_prob": 0.1, "hazy_prob": 0.008, "hazy_alpha": [0.75, 0.95],
        "crop_components": True, "eye_enlarge_ratio": 1.4}
ROHQD = {"type": "FFHQAugDataset", "use_hflip": True, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
         "out_size": 64, "gray_prob": 0.008, "gt_gray": True, "exposure_prob": None, "exposure_range": [0.7, 1.1],
         "shift_prob": 0.2, "shift_unit": 1, "shift_max_num": 32}


def _settings(**keys: Any) -> UnevenDegradationSettings:
    """Settings from the authors' keys (GFPGAN's jitter ranges, which the options fill, added)."""
    jitter = {"brightness": [0.5, 1.5], "contrast": [0.5, 1.5], "saturation": [0, 1.5], "hue": [-0.1, 0.1]}
    return UnevenDegradationSettings.from_options({**RFPP, **jitter, **keys})


def _options(root: Path, **keys: Any) -> Any:
    base = {"type": "FFHQUnevenDegradationDataset", "dataroot_gt": str(root), "batch_size_per_gpu": 1,
            "out_size": 64, "use_hflip": True}
    opts = {**base, **keys}
    if opts.get("crop_components") and "component_path" not in opts:
        opts["component_path"] = str(FIXTURES / "landmarks.pth")
    return validate_dataset(opts, name="train")


def _dataset(root: Path, **keys: Any) -> Any:
    return build_dataset(_options(root, **keys), "datasets.train")


@pytest.fixture()
def faces(tmp_path: Path) -> Path:
    """A folder of three 64x64 faces (the fixture's Set5 crops)."""
    root = tmp_path / "faces"
    root.mkdir()
    for stem in SMALL:
        shutil.copy(IMAGES / f"{stem}.png", root / f"{stem}.png")
    return root


def _case_dataset(tmp_path: Path, key: str) -> tuple[Any, dict[str, Any]]:
    case = META["cases"][key]
    root = tmp_path / "gt"
    root.mkdir()
    shutil.copy(IMAGES / f"{case['stem']}.png", root)
    kind = "FFHQAugDataset" if case["cls"] == "FFHQAugDataset" else "FFHQUnevenDegradationDataset"
    return _dataset(root, **{**case["options"], "type": kind}), case


def _check_gt(key: str, gt: torch.Tensor) -> None:
    if f"{key}.gt8" in EXPECTED:  # on 8-bit levels: exact
        levels = torch.round((gt * 0.5 + 0.5) * 255.0)
        assert torch.equal(levels, torch.from_numpy(EXPECTED[f"{key}.gt8"].astype(np.float32)))
        torch.testing.assert_close((gt * 0.5 + 0.5) * 255.0, levels, atol=1e-4, rtol=0)
    else:  # exposed or gray: the authors' float32 GT, stored as float16
        want = torch.from_numpy(EXPECTED[f"{key}.gt"].astype(np.float32))
        torch.testing.assert_close(gt, want, atol=6e-4, rtol=0)  # float16's half step below 2


# ------------------------------------------------------------------------------- equality with the authors
@pytest.mark.parametrize("key", DEGRADED)
def test_whole_sample_equals_the_authors(tmp_path: Path, key: str) -> None:
    """The whole item (read, flip, exposure, shift, branches, haze, square, jitters, gray, normalise, boxes) on the
    fixture's recipe: the LQ on the authors' 8-bit levels (the same OpenCV for filter2D, resize and JPEG; float math
    may flip a rounding, so one level on a few pixels is allowed), the GT exact on 8-bit levels (float16-stored
    elsewhere), the boxes to float32."""
    ds, case = _case_dataset(tmp_path, key)
    item = ds.make_item(0, UnevenDegradationDraws.from_dict(case["draws"]))
    lq = np.rint((item["lq"].numpy() * 0.5 + 0.5) * 255.0)
    diff = np.abs(lq - EXPECTED[f"{key}.lq"].astype(np.float64))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.002, (diff.max(), (diff > 0).mean())
    _check_gt(key, item["gt"])
    assert sorted(k for k in item if k.startswith("loc_")) == sorted(case["boxes"])
    for name, box in case["boxes"].items():
        torch.testing.assert_close(item[name], torch.tensor(box, dtype=torch.float32), atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", sorted(k for k in DEGRADED if META["cases"][k].get("branches_stored")))
def test_each_branch_equals_the_authors(tmp_path: Path, key: str) -> None:
    """Stage by stage: the GT after flip / exposure / shift, then each branch (blur, haze, resize, noise, JPEG,
    resize back) before the square is pasted, against the authors' (float16-stored: its half step)."""
    ds, case = _case_dataset(tmp_path, key)
    draws = UnevenDegradationDraws.from_dict(case["draws"])
    gt = _float_bgr(ds._read_gt(0)[2], ds.path(0))
    if draws.hflip:
        gt = np.ascontiguousarray(gt[:, ::-1])
    gt = expose_and_shift(gt, draws.augment, ds.uneven)
    if not draws.gray:
        _check_gt(key, (torch.from_numpy(gt[:, :, ::-1].transpose(2, 0, 1).copy()) - 0.5) / 0.5)
    for i, b in enumerate(draws.branches):
        want = EXPECTED[f"{key}.branch{i}"].astype(np.float32)
        np.testing.assert_allclose(_branch(gt, b), want, atol=5e-4, rtol=0)  # float16 storage: 2.4e-4


@pytest.mark.parametrize("key", AUGMENTED)
def test_augmented_face_equals_the_authors(tmp_path: Path, key: str) -> None:
    ds, case = _case_dataset(tmp_path, key)
    d = case["draws"]
    augment = FaceAugmentDraws(d["hflip"], d["exposure"], None if d["shift"] is None else tuple(d["shift"]))
    item = ds.make_item(0, (augment, d["gray"]))
    assert sorted(item) == ["gt", "gt_path"]
    _check_gt(key, item["gt"])


# ------------------------------------------------------------------------------------------------ the draws
def test_draws_hit_their_rates_and_ranges() -> None:
    """Over many counters: each coin at its probability, the kernel sizes 2k + 1 for k uniform in the range, the
    shift's steps uniform in [0, 2 max], the square inside the face with its side in patch_range, the haze's alpha
    and the exposure in their ranges, one branch unless uneven."""
    n, size = 4000, 64
    s = _settings(blur_kernel_size=[1, 3], exposure_prob=0.3, shift_prob=0.2, shift_unit=2, shift_max_num=4,
                  uneven_prob=0.1, hazy_prob=0.4, gray_prob=0.25, color_jitter_pt_prob=0.5)
    draws = [draw_uneven_degradation(np.random.default_rng([i, 10]), s, size, use_hflip=True) for i in range(n)]

    def near(count: int, p: float, total: int = n) -> bool:
        return abs(count - p * total) <= 4.5 * (p * (1 - p) * total) ** 0.5

    assert near(sum(d.hflip for d in draws), 0.5)
    assert near(sum(d.augment.exposure is not None for d in draws), 0.3)
    assert near(sum(d.augment.shift is not None for d in draws), 0.2)
    uneven = [d for d in draws if d.patch is not None]
    assert near(len(uneven), 0.1) and all(len(d.branches) == (2 if d.patch else 1) for d in draws)
    assert near(sum(d.gray for d in draws), 0.25) and near(sum(d.jitter is not None for d in draws), 0.5)
    branches = [b for d in draws for b in d.branches]
    assert near(sum(b.haze is not None for b in branches), 0.4, len(branches))
    sizes = Counter(b.kernel.size for b in branches)
    assert set(sizes) == {3, 5, 7} and all(near(c, 1 / 3, len(branches)) for c in sizes.values())
    assert all(0.75 <= b.haze <= 0.95 for b in branches if b.haze is not None)
    assert all(0.7 <= d.augment.exposure <= 1.1 for d in draws if d.augment.exposure is not None)
    steps = Counter(v for d in draws if d.augment.shift for v in d.augment.shift)
    assert set(steps) == set(range(9)) and all(near(c, 1 / 9, sum(steps.values())) for c in steps.values())
    lo, hi = patch_range(size)
    assert (lo, hi) == (16, 32) and patch_range(512) == (128, 256)  # the authors' [128, 256] at 512
    assert all(lo <= d.patch[0] <= hi and d.patch[1] + d.patch[0] <= size and d.patch[2] + d.patch[0] <= size
               for d in uneven)
    assert {d.patch[0] for d in uneven} == set(range(lo, hi + 1))


def test_steps_that_are_off_draw_nothing_but_keep_the_stream() -> None:
    """Null probabilities: no exposure, shift, haze, square or gray; and the same seed gives the same branch draws
    whether or not the other steps are on (every coin and value is drawn)."""
    off = _settings(shift_prob=None, uneven_prob=None, hazy_prob=None, gray_prob=None)
    on = _settings(shift_prob=1.0, hazy_prob=1.0)
    for i in range(50):
        a = draw_uneven_degradation(np.random.default_rng([i, 10]), off, 64, use_hflip=True)
        b = draw_uneven_degradation(np.random.default_rng([i, 10]), on, 64, use_hflip=True)
        assert a.augment.shift is None and a.patch is None and a.branches[0].haze is None and not a.gray
        assert b.augment.shift is not None and b.branches[0].haze is not None
        assert a.as_dict()["branches"][0] == {**b.as_dict()["branches"][0], "haze": None}
        assert a.color_shift == b.color_shift and a.jitter == b.jitter


# ------------------------------------------------------------------------------------------ determinism
def test_same_seed_same_sample_in_any_order_and_worker(faces: Path) -> None:
    keys = {**RFPP, "shift_prob": 0.5, "uneven_prob": 0.5, "hazy_prob": 0.5, "exposure_prob": 0.5,
            "gray_prob": 0.3, "color_jitter_pt_prob": 0.5}
    order = [(0, 7), (2, 7), (1, 123), (0, 8), (2, 99), (1, 5)]
    ds = _dataset(faces, **keys)
    assert_seeded_samples(lambda: _dataset(faces, **keys), order, via_loader=("lq", "loc_mouth"))
    for seed in (7, 8, 99):
        record = ds.degradation_record(seed)
        assert json.loads(json.dumps(record)) == record and record["type"] == "restoreformer"
        assert UnevenDegradationDraws.from_dict(record).as_dict() == ds.draws(seed).as_dict()
    aug = {**ROHQD, "shift_prob": 0.5, "gray_prob": 0.5}
    assert_seeded_samples(lambda: _dataset(faces, **aug), order, via_loader=("gt",))


def test_shift_moves_the_face_and_its_boxes_together(faces: Path) -> None:
    """A shift by (dv, dh) steps moves every pixel and every box by unit * (max - steps): the image's content at a
    box is the content of the unshifted image at the unshifted box."""
    ds = _dataset(faces, **{**RFPP, "mean": None, "std": None, "shift_unit": 2, "shift_max_num": 3,
                            "use_hflip": False})
    base = UnevenDegradationDraws.from_dict({**ds.draws(0).as_dict(), "shift": None, "exposure": None})
    moved = UnevenDegradationDraws.from_dict({**base.as_dict(), "shift": [1, 5]})
    a, b = ds.make_item(0, base), ds.make_item(0, moved)
    dv, dh = 2 * (3 - 1), 2 * (3 - 5)  # the content moves down by 4 and left by 4
    assert torch.equal(b["gt"][:, dv:, :dh], a["gt"][:, :-dv, -dh:])
    for name in ("loc_left_eye", "loc_right_eye", "loc_mouth"):
        torch.testing.assert_close(b[name], a[name] + torch.tensor([dh, dv, dh, dv], dtype=torch.float32))


def test_uneven_square_comes_from_the_first_branch(faces: Path) -> None:
    ds = _dataset(faces, **{**RFPP, "uneven_prob": 1.0, "gray_prob": None})
    d = ds.draws(3)
    assert d.patch is not None
    side, top, left = d.patch
    two = ds.make_item(0, d)["lq"]
    first = ds.make_item(0, UnevenDegradationDraws.from_dict({**d.as_dict(), "branches": d.as_dict()["branches"][:1],
                                                              "patch": None}))["lq"]
    sq = (slice(None), slice(top, top + side), slice(left, left + side))
    assert torch.equal(two[sq], first[sq]) and not torch.equal(two, first)


# ------------------------------------------------------------------------------------ options and errors
def test_the_authors_option_values_validate_and_load(faces: Path) -> None:
    ds = _dataset(faces, **RFPP)
    assert isinstance(ds, FFHQUnevenDegradationDataset)
    assert ds.uneven.kernel_sizes == (19, 20) and ds.uneven.shift_pad == 32 and ds.uneven.uneven_prob == 0.1
    assert sorted(ds[1]) == ["gt", "gt_path", "loc_left_eye", "loc_mouth", "loc_right_eye", "lq", "seed"]
    aug = _dataset(faces, **ROHQD)
    assert isinstance(aug, FFHQAugDataset) and sorted(aug[1]) == ["gt", "gt_path", "seed"]
    defaults = _options(faces)
    assert defaults["exposure_range"] == [0.7, 1.1] and defaults["hazy_alpha"] == [0.75, 0.95]
    assert (defaults["shift_unit"], defaults["shift_max_num"]) == (32, 3)  # the authors' code's defaults
    assert defaults["uneven_prob"] is None and defaults["blur_kernel_size"] == 41


def _one_line(exc: pytest.ExceptionInfo[BaseException], *parts: str) -> None:
    lines = str(exc.value).splitlines()
    assert len(lines) == 2, str(exc.value)  # OptionError: "1 problem(s):" + one
    for part in parts:
        assert part in lines[-1], (part, str(exc.value))


@pytest.mark.parametrize(("keys", "where", "says"), [
    ({"uneven_prob": 1.5}, "datasets.train.uneven_prob", "1"),
    ({"hazy_alpha": [0.9, 1.2]}, "datasets.train.hazy_alpha", "high <= 1"),
    ({"exposure_range": [-0.5, 1.0]}, "datasets.train.exposure_range", "low >= 0"),
    ({"blur_kernel_size": [20, 19]}, "datasets.train.blur_kernel_size", "0 <= low <= high"),
    ({"blur_kernel_size": 20}, "datasets.train.blur_kernel_size", "odd"),
    ({"shift_unit": -1}, "datasets.train.shift_unit", ">= 0"),
    ({"hazy_prb": 0.1}, "datasets.train.hazy_prb", "hazy_prob"),
    ({"gt_size": 32}, "datasets.train.gt_size", "is not read by FFHQUnevenDegradationDataset"),
    ({"type": "FFHQDegradationDataset", "uneven_prob": 0.1}, "datasets.train.uneven_prob",
     "use type FFHQUnevenDegradationDataset"),
    ({"type": "FFHQDegradationDataset", "blur_kernel_size": [19, 20]}, "datasets.train.blur_kernel_size",
     "FFHQUnevenDegradationDataset's"),
    ({"type": "FFHQAugDataset", "noise_range": [0, 20]}, "datasets.train.noise_range",
     "is not read by FFHQAugDataset"),
    ({"type": "FFHQAugDataset", "uneven_prob": 0.1}, "datasets.train.uneven_prob", "is not read by FFHQAugDataset"),
    ({"type": "FFHQAugDataset", "dataroot_gt": None}, "datasets.train.dataroot_gt", "required"),
])
def test_bad_options_name_the_key(faces: Path, keys: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(OptionError) as exc:
        _options(faces, **keys)
    _one_line(exc, where, says)


def test_scale_must_be_one(faces: Path) -> None:
    for kind in ("FFHQUnevenDegradationDataset", "FFHQAugDataset"):
        with pytest.raises(OptionError) as exc:
            validate_dataset({"type": kind, "dataroot_gt": str(faces), "batch_size_per_gpu": 1, "out_size": 64},
                             name="train", scale=2)
        _one_line(exc, "datasets.train.type", "scale 1")


def test_faces_of_another_size_are_found_before_training(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    root.mkdir()
    shutil.copy(IMAGES / "00000000.png", root)
    shutil.copy(IMAGES / "00000002.png", root)  # 128x128
    for kind in ("FFHQUnevenDegradationDataset", "FFHQAugDataset"):
        problems = _dataset(root, type=kind).check(decode=False, progress=False)
        assert len(problems) == 1 and "00000002.png is 128x128" in problems[0] and "out_size" in problems[0]
