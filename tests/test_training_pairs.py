"""See what you train on: ``anysr prepare degrade`` for every training file (paired folders, ``lq_from_gt``,
Real-ESRGAN's paired dataset, video clips) writes exactly the pairs the training step sees, and the trainer keeps a
few crops of the pairs it trained on at each validation, which report.html shows (checked in headless Chromium)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from browser import Browser, find_chromium
from conftest import run_cli, tiny_train_options, write_options
from test_realesrgan import real_options
from test_video_train import FAST, SHRINK, TRAIN, paths
from video_data import make_reds

from anysr.data import build_dataset
from anysr.data.transforms import tensor2img
from anysr.engine.report.pair_samples import PAIRS_DIR, frame_pair, read_pair_index, save_training_pairs
from anysr.engine.report.run_report import write_report
from anysr.options import load_options

CHROMIUM = find_chromium()


def _img(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


def _same_as_saved(exp: Path, pairs_dir: Path, it: int, pairs: list[dict[str, Any]], frame: str = "") -> int:
    """Every pair the trainer saved at iteration ``it`` equals the pair of that iteration ``prepare degrade`` wrote
    (the trainer's crop is the whole pair here); returns how many were compared."""
    entry = next(e for e in read_pair_index(exp) if e["iter"] == it)
    batch = entry["batch"]
    at = pairs[(it - 1) * batch:it * batch]  # the order pairs train in (a pooled pair's record is its draw's)
    assert len(at) == batch >= len(entry["pairs"]) > 0
    for saved in entry["pairs"]:
        mine = at[saved["batch_position"]]
        for role in ("gt", "lq"):
            ours = _img(exp / PAIRS_DIR / saved["files"][role])
            theirs = _img(pairs_dir / f"{mine['pair']}_{role}{frame}.png")
            np.testing.assert_array_equal(ours, theirs, err_msg=f"iteration {it}, {mine['pair']} {role}")
    return len(entry["pairs"])


# ------------------------------------------------------------------------------------------- units
def test_save_training_pairs_crops_the_same_region_and_keeps_the_latest(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    gt = torch.rand(6, 3, 300, 260, generator=g)
    lq = torch.rand(6, 3, 75, 65, generator=g)
    for it in (10, 20, 30):
        save_training_pairs(tmp_path, it, lq, gt, count=3, crop=128, keep=2)
    entries = read_pair_index(tmp_path)
    assert [e["iter"] for e in entries] == [20, 30]
    root = tmp_path / PAIRS_DIR
    assert not (root / "iter_00000010").exists() and (root / "iter_00000030").is_dir()
    e = entries[-1]
    assert e["scale"] == 4 and e["batch"] == 6 and len(e["pairs"]) == 3
    top, left, h, w = e["box_lq"]
    assert (h, w) == (32, 32) and (top, left) == ((75 - 32) // 2, (65 - 32) // 2)
    for k, p in enumerate(e["pairs"]):
        g_img, l_img = _img(root / p["files"]["gt"]), _img(root / p["files"]["lq"])
        assert g_img.shape == (128, 128, 3) and l_img.shape == (32, 32, 3)
        np.testing.assert_array_equal(g_img, tensor2img(gt[k, :, top * 4:(top + h) * 4, left * 4:(left + w) * 4]))
        np.testing.assert_array_equal(l_img, tensor2img(lq[k, :, top:top + h, left:left + w]))


def test_frame_pair_takes_the_centre_frame_of_clips() -> None:
    lq = torch.arange(2 * 3 * 1 * 2 * 2, dtype=torch.float32).reshape(2, 3, 1, 2, 2)
    gt5 = torch.arange(2 * 3 * 1 * 8 * 8, dtype=torch.float32).reshape(2, 3, 1, 8, 8)
    a, b = frame_pair(lq, gt5)
    assert torch.equal(a, lq[:, 1]) and torch.equal(b, gt5[:, 1])
    a, b = frame_pair(lq, gt5.flatten(0, 1))  # a GAN video model's flattened frames
    assert torch.equal(b, gt5[:, 1])
    a, b = frame_pair(lq, gt5[:, 0])  # EDVR: the GT is the centre frame already
    assert torch.equal(b, gt5[:, 0]) and torch.equal(a, lq[:, 1])
    images = torch.rand(2, 3, 4, 4)
    assert frame_pair(images, images)[0] is images


# --------------------------------------------------------------------- image models, through the CLI
@pytest.fixture(scope="module")
def paired_run(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path, small_val_dir: Path) -> dict[str, Any]:
    """A tiny lq_from_gt training with the batch augmentations, validated at iterations 3 and 6, and the first 24
    pairs of its options file from ``anysr prepare degrade``."""
    tmp = tmp_path_factory.mktemp("pairs")
    opt = tiny_train_options("pp", small_train_dir, small_val_dir, total_iter=6)
    opt["train"]["use_moa"] = True
    opt["train"]["moa_augs"] = ["none", "rgb"]  # rgb: the same channel order drawn for LQ and GT
    opt["train"]["moa_probs"] = [0.5, 0.5]
    path = write_options(tmp / "pp.yml", opt)
    train = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp}", cwd=tmp)
    prep = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp}", "--out",
                   str(tmp / "shown"), "-n", "24", cwd=tmp)
    return {"tmp": tmp, "exp": tmp / "experiments" / "pp", "path": path, "train": train, "prep": prep,
            "shown": tmp / "shown"}


@pytest.mark.slow
def test_prepare_degrade_writes_the_pairs_a_paired_training_sees(paired_run: dict[str, Any]) -> None:
    assert "wrote 24 LQ/GT pair(s) as the training step sees them (read from the dataset)" in paired_run["prep"].stdout
    meta = json.loads((paired_run["shown"] / "degrade.json").read_text())
    assert meta["use_moa"] and meta["degrade_in"] == "dataset" and meta["model_type"] == "SRModel"
    pairs = meta["pairs"]
    assert [p["pair"] for p in pairs] == [f"{j:04d}" for j in range(24)]
    assert [p["iteration"] for p in pairs] == [1 + j // 4 for j in range(24)]
    opt = load_options(paired_run["path"], [f"path.root={paired_run['tmp']}"], is_train=True)
    ds = build_dataset(opt.datasets.train, "datasets.train")
    augmented = 0
    for p in pairs:
        assert _img(paired_run["shown"] / p["files"]["gt"][0]).shape == (32, 32, 3)
        assert _img(paired_run["shown"] / p["files"]["lq"][0]).shape == (16, 16, 3)
        item = ds[(p["index"], p["sample_seed"])]  # the crop and flips of that index and seed
        assert p["gt_path"] == item["gt_path"]
        gt, lq = (_img(paired_run["shown"] / f"{p['pair']}_{r}.png") for r in ("gt", "lq"))
        if np.array_equal(gt, tensor2img(item["gt"])):  # "none" drawn for this micro-batch
            np.testing.assert_array_equal(lq, tensor2img(item["lq"]))
        else:  # "rgb": the item's channels, permuted alike in LQ and GT
            order = next(o for o in ([0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0])
                         if np.array_equal(gt, tensor2img(item["gt"][o])))
            np.testing.assert_array_equal(lq, tensor2img(item["lq"][order]))
            augmented += 1
    assert 0 < augmented < 24  # the batch augmentation changed some pairs, as the step does
    # the trainer's own record of what it trained on (iterations 3 and 6) is the same
    assert _same_as_saved(paired_run["exp"], paired_run["shown"], 3, pairs) == 4
    assert _same_as_saved(paired_run["exp"], paired_run["shown"], 6, pairs) == 4


@pytest.mark.slow
def test_report_shows_the_training_pairs(paired_run: dict[str, Any]) -> None:
    html = (paired_run["exp"] / "report.html").read_text()
    assert '<h2 id="pairs">Training pairs</h2>' in html
    assert html.count('class="pairs-at"') == 2 and html.count('class="pair-gt"') == 8
    assert html.index('data-iter="6" open') < html.index('data-iter="3"')  # the latest first, open
    assert 'data-iter="3" open' not in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")
def test_training_pairs_in_a_headless_browser(paired_run: dict[str, Any], tmp_path: Path) -> None:
    page = (paired_run["exp"] / "report.html").resolve()
    probe = ("(() => {const open = [...document.querySelectorAll('details.pairs-at')].map(d => d.open);"
             "const figs = [...document.querySelectorAll('details.pairs-at[open] figure.pair')].map(f => {"
             " const g = f.querySelector('img.pair-gt'), l = f.querySelector('img.pair-lq');"
             " const gr = g.getBoundingClientRect(), lr = l.getBoundingClientRect();"
             " return {gt: [g.naturalWidth, g.naturalHeight, gr.width, gr.height],"
             "  lq: [l.naturalWidth, l.naturalHeight, lr.width, lr.height], side: lr.left >= gr.right,"
             "  style: getComputedStyle(l).imageRendering};});"
             "return {open, figs, scroll: document.documentElement.scrollWidth, inner: innerWidth};})()")
    with Browser(CHROMIUM or "", tmp_path / "profile") as b:
        b.open(page.as_uri())
        b.evaluate("new Promise(r => setTimeout(r, 200))")
        for size in ((1366, 768), (1280, 800)):
            b.viewport(*size)
            m = b.evaluate(probe)
            assert m["open"] == [True, False] and len(m["figs"]) == 4, m
            for f in m["figs"]:
                assert f["gt"] == [32, 32, 32, 32] and f["lq"][:2] == [16, 16], f  # decoded: the LQ is half size
                assert f["lq"][2:] == [32, 32] and f["side"] and f["style"] == "pixelated", f  # drawn upscaled
            assert m["scroll"] <= size[0], m
        b.evaluate("document.querySelectorAll('details.pairs-at')[1].open = true")
        assert len(b.evaluate(probe)["figs"]) == 8
        b.screenshot(tmp_path / "pairs.png")
        assert b.console_errors() == []
        assert {u.split(":", 1)[0] for u in b.requests()} <= {"file", "data"}


def test_report_without_training_pairs_says_so(tmp_path: Path) -> None:
    exp = tmp_path / "e"
    exp.mkdir()
    (exp / "summary.json").write_text(json.dumps({"name": "e"}))
    html = write_report(exp).read_text()
    assert "No training pairs yet" in html
    save_training_pairs(exp, 5, torch.rand(2, 3, 8, 8), torch.rand(2, 3, 16, 16))
    html = write_report(exp).read_text()
    assert "No training pairs yet" not in html and html.count('class="pair-lq"') == 2


def test_degrade_in_is_refused_for_a_model_that_reads_its_pairs(tmp_path: Path, small_train_dir: Path) -> None:
    path = write_options(tmp_path / "o.yml", tiny_train_options("o", small_train_dir, None))
    bad = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--out",
                  str(tmp_path / "x"), "--degrade-in", "loader", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "does not synthesise its training pairs" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_prepare_degrade_reads_the_real_esrgan_paired_dataset(tmp_path: Path, small_train_dir: Path) -> None:
    """Real-ESRGAN's paired dataset (real LQ folder, ``<gt>, <lq>`` meta_info lines) with a Real-ESRGAN model."""
    lq_dir = tmp_path / "lq"
    lq_dir.mkdir()
    names = sorted(p.name for p in small_train_dir.glob("*.png"))[:4]
    for n in names:
        img = cv2.imread(str(small_train_dir / n))
        h, w = img.shape[:2]
        cv2.imwrite(str(lq_dir / n), cv2.resize(img[:h - h % 4, :w - w % 4], (w // 4, h // 4),
                                                interpolation=cv2.INTER_AREA))
    (tmp_path / "meta.txt").write_text("".join(f"{n}, {n}\n" for n in names))
    opt = real_options("rp", small_train_dir, model="RealESRNetModel", high_order_degradation=False, datasets={
        "train": {"name": "rp", "type": "RealESRGANPairedDataset", "dataroot_gt": str(small_train_dir),
                  "dataroot_lq": str(lq_dir), "meta_info": str(tmp_path / "meta.txt"), "io_backend": {"type": "disk"},
                  "gt_size": 32, "use_hflip": True, "use_rot": True, "batch_size_per_gpu": 2}})
    path = write_options(tmp_path / "rp.yml", opt)
    proc = run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--out",
                   str(tmp_path / "out"), "-n", "3", cwd=tmp_path)
    assert "wrote 3 LQ/GT pair(s)" in proc.stdout and "(read from the dataset)" in proc.stdout
    meta = json.loads((tmp_path / "out" / "degrade.json").read_text())
    assert meta["dataset"] == "RealESRGANPairedDataset" and not meta["use_moa"]
    ds = build_dataset(load_options(path, [f"path.root={tmp_path}"], is_train=True).datasets.train, "d")
    for p in meta["pairs"]:
        item = ds[(p["index"], p["sample_seed"])]
        assert Path(p["lq_path"]).parent == lq_dir and p["lq_path"] == item["lq_path"]
        for role in ("gt", "lq"):
            np.testing.assert_array_equal(_img(tmp_path / "out" / f"{p['pair']}_{role}.png"), tensor2img(item[role]))
        assert _img(tmp_path / "out" / f"{p['pair']}_lq.png").shape == (8, 8, 3)


@pytest.mark.slow
def test_real_esrgan_synthesis_saved_at_validation_is_what_prepare_degrade_writes(
        tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    """The trainer's pairs of a Real-ESRGAN run (synthesised in the step, through the pair pool) at each validation
    are the pairs of those iterations ``prepare degrade`` synthesises."""
    opt = real_options("rs", small_train_dir, total_iter=4, gt_usm=False)
    opt["datasets"]["val"] = {"name": "val", "type": "PairedImageDataset", "dataroot_gt": str(small_val_dir),
                              "lq_from_gt": True, "io_backend": {"type": "disk"}}
    opt["val"] = {"val_freq": 2, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 4}}}
    path = write_options(tmp_path / "rs.yml", opt)
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    run_cli("prepare", "degrade", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "--out",
            str(tmp_path / "shown"), "-n", "8", cwd=tmp_path)
    pairs = json.loads((tmp_path / "shown" / "degrade.json").read_text())["pairs"]
    exp = tmp_path / "experiments" / "rs"
    assert [e["iter"] for e in read_pair_index(exp)] == [2, 4]
    assert _same_as_saved(exp, tmp_path / "shown", 2, pairs) == 2  # iteration 4: out of the full pool
    assert _same_as_saved(exp, tmp_path / "shown", 4, pairs) == 2


# --------------------------------------------------------------------------------------------- video
@pytest.mark.slow
def test_video_clips_prepare_degrade_frames_and_trainer_centre_frame(tmp_path: Path) -> None:
    """BasicVSR on REDS clips: ``prepare degrade`` writes frames of each clip, and the trainer's pair at the
    validation is the centre frame of that iteration's clip."""
    reds = make_reds(tmp_path / "reds", clips=("000", "001", "002", "011"), frames=5)
    val = make_reds(tmp_path / "reds4", clips=("000", "011"), frames=3, size=(32, 32))
    torch.manual_seed(0)
    from anysr.archs import build_network

    torch.save({"params": build_network({"type": "SpyNet"}).state_dict()}, tmp_path / "spynet.pth")
    data = {"root": tmp_path, "reds_gt": reds["gt"], "reds_lq": reds["lq"], "reds_meta": reds["meta"],
            "val_gt": val["gt"], "val_lq": val["lq"], "spynet": tmp_path / "spynet.pth"}
    file = "train_BasicVSR_REDS.yml"
    args = ["--force_yml", *paths(data, "vsr", file), *FAST, *SHRINK[file]]
    run_cli("train", "-opt", str(TRAIN / file), *args, cwd=tmp_path)
    proc = run_cli("prepare", "degrade", "-opt", str(TRAIN / file), *args, "--out", str(tmp_path / "shown"), "-n",
                   "2", "--frames", "3", cwd=tmp_path)
    assert "wrote 2 LQ/GT pair(s)" in proc.stdout
    meta = json.loads((tmp_path / "shown" / "degrade.json").read_text())
    first = meta["pairs"][0]
    assert first["files"]["lq"] == ["0000_lq_f00.png", "0000_lq_f01.png", "0000_lq_f02.png"]
    assert first["files"]["gt"] == ["0000_gt_f00.png", "0000_gt_f01.png", "0000_gt_f02.png"]
    assert first["lq_shape"] == [3, 3, 8, 8] and first["gt_shape"] == [3, 3, 32, 32] and first["key"]
    # the trainer validated at iteration 2 (batch 1): its pair is the centre frame of pair 0001
    exp = tmp_path / "experiments" / "vsr"
    assert _same_as_saved(exp, tmp_path / "shown", 2, meta["pairs"], frame="_f01") == 1
    shutil.rmtree(tmp_path / "reds")
